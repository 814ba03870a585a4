"""The python backend's response sender in every pattern Triton's own test tries: zero, one or more
responses sent before execute returns, after it returns (from a thread, or from an asyncio task of
`async def execute`), or returned, with the final flag before or after the return, for decoupled and
non-decoupled models, alone and batched on one gRPC stream. Every pattern ends: with Triton's
responses, or with Triton's error, never with a client left waiting."""

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from conftest import serving, wait_for, write_model
from probes import SENDER_PATTERNS, response_sender_outcome, response_sender_repo, sender_pattern_inputs

FINAL_FIRST = ("Unable to send response. Non-decoupled model cannot send complete final before sending a "
               "response.")


def _in_execute(model: str, message: str) -> str:
    return f"error: Failed to process the request(s) for model '{model}_0_0', message: {message}"


def expected(model: str, pattern: str) -> tuple:
    """What a client receives, per response, as response_sender_outcome reports it."""
    if "decoupled" in model:
        if pattern in ("on_return", "on_and_post"):  # a decoupled execute must return None
            return (_in_execute(model, f"Python model '{model}_0_0' is using the decoupled mode and the "
                                       "execute function must return None."),)
        before, _, _, after, _ = SENDER_PATTERNS[pattern]
        if pattern == "pre_and_on":
            after = 0
        return tuple(sorted(["before"] * before + ["after"] * after))
    return {
        "zero_pre": (_in_execute(model, f"TritonModelException: {FINAL_FIRST}"),),
        # Triton 2.51 leaves these two waiting; the rule the model breaks after execute returns ends them
        "zero_post": (f"error: {FINAL_FIRST}",),
        "two_post": ("after",),
        "pre_and_post": ("before",),  # the second response raises in the model; the first was sent
    }.get(pattern, ("returned",) if pattern in ("on_return", "on_and_post") else
          ("before",) if pattern in ("one_pre", "two_pre", "pre_and_on") else ("after",))


@pytest.fixture(scope="module")
def sender_server(tmp_path_factory):
    repo = response_sender_repo(tmp_path_factory.mktemp("sender") / "repo")
    write_model(repo, "drops_sender", DROPS_SENDER,
                'backend: "python"\nmax_batch_size: 0\nmodel_transaction_policy { decoupled: true }\n'
                'input [ { name: "N", data_type: TYPE_INT32, dims: [ 1 ] } ]\n'
                'output [ { name: "I", data_type: TYPE_INT32, dims: [ 1 ] } ]\n')
    with serving([repo], [], tmp_path_factory) as s:
        yield s


MODELS = ["response_sender", "response_sender_async", "response_sender_decoupled", "response_sender_decoupled_async"]


@pytest.mark.parametrize("model", MODELS)
def test_every_pattern_ends_with_tritons_answer(sender_server, model):
    for pattern in SENDER_PATTERNS:
        assert response_sender_outcome(sender_server.grpc_url, model, [pattern]) == expected(model, pattern), pattern


@pytest.mark.parametrize("model", ["response_sender_decoupled_batching", "response_sender_decoupled_async_batching"])
def test_decoupled_requests_batched_together_each_respond_their_way(sender_server, model):
    patterns = ["zero_pre", "zero_post", "one_pre", "one_post", "two_pre", "two_post", "pre_and_post"]
    assert response_sender_outcome(sender_server.grpc_url, model, patterns) == tuple(
        sorted(["before"] * 4 + ["after"] * 6))


@pytest.mark.parametrize("model", ["response_sender_batching", "response_sender_async_batching"])
def test_non_decoupled_requests_batched_together_each_respond_their_way(sender_server, model):
    outcome = response_sender_outcome(sender_server.grpc_url, model, ["on_return", "one_pre", "one_post"])
    assert outcome == ("after", "before", "returned")


@pytest.mark.parametrize("model", ["response_sender", "response_sender_async"])
def test_a_response_sent_after_execute_returns_answers_http_and_grpc_calls(sender_server, model):
    http = httpclient.InferenceServerClient(sender_server.url)
    try:
        result = http.infer(model, sender_pattern_inputs(httpclient, "one_post"))
        assert result.as_numpy("INDEX").tolist() == [[2000]]
    finally:
        http.close()
    with grpcclient.InferenceServerClient(sender_server.grpc_url) as grpc:
        assert grpc.infer(model, sender_pattern_inputs(grpcclient, "one_pre")).as_numpy("INDEX").tolist() == [[1000]]
        assert grpc.infer(model, sender_pattern_inputs(grpcclient, "on_return")).as_numpy("INDEX").tolist() == [[0]]


DROPS_SENDER = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            n = int(pb_utils.get_input_tensor_by_name(request, "N").as_numpy()[0])
            for i in range(n):
                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("I", np.array([i], np.int32))]))
        return None  # the senders are dropped without their final flag
"""


def test_a_sender_dropped_without_its_final_flag_ends_the_request_with_an_error(sender_server):
    import queue

    results: queue.Queue = queue.Queue()
    with grpcclient.InferenceServerClient(sender_server.grpc_url) as client:
        client.start_stream(callback=lambda result, error: results.put((result, error)))
        x = grpcclient.InferInput("N", [1], "INT32")
        x.set_data_from_numpy(np.array([2], np.int32))
        client.async_stream_infer("drops_sender", [x])
        got = [results.get(timeout=30) for _ in range(3)]
        client.stop_stream()  # returns: the request has ended
    assert [int(r.as_numpy("I")[0]) for r, e in got[:2]] == [0, 1]
    assert got[2][0] is None and "without sending its final response" in got[2][1].message()


def test_the_model_sees_the_rules_it_breaks_raised(sender_server):
    """A send after the final flag raises in the model (in a thread, after execute returned: the
    server logs it), and the server stays healthy for the next request."""
    response_sender_outcome(sender_server.grpc_url, "response_sender_decoupled", ["pre_and_on"])
    assert response_sender_outcome(sender_server.grpc_url, "response_sender", ["two_post"]) == ("after",)
    wait_for(lambda: "Non-decoupled model cannot send more than one response" in sender_server.log(), 30,
             "the model's thread to report the exception raised by its second send")
    assert response_sender_outcome(sender_server.grpc_url, "response_sender", ["one_pre"]) == ("before",)
