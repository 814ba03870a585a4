"""Decoupled python models: any number of responses per request over the gRPC stream, sent from
the model's own threads, errors in between; unary endpoints say they cannot serve them."""

import queue

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException


def _n(module, n):
    x = module.InferInput("N", [1], "INT32")
    x.set_data_from_numpy(np.array([n], np.int32))
    return [x]


def _collect(client, results, count, timeout=30):
    got = []
    for _ in range(count):
        got.append(results.get(timeout=timeout))
    return got


def test_many_responses_per_request(server):
    client = grpcclient.InferenceServerClient(server.grpc_url)
    results: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    try:
        client.async_stream_infer("repeat", _n(grpcclient, 3), request_id="three")
        client.async_stream_infer("repeat", _n(grpcclient, 2), request_id="two")
        got = _collect(client, results, 5)
    finally:
        client.stop_stream()
    assert all(error is None for _, error in got)
    by_id: dict[str, list[int]] = {}
    for result, _ in got:
        by_id.setdefault(result.get_response().id, []).append(int(result.as_numpy("I")[0]))
    assert by_id == {"three": [0, 1, 2], "two": [0, 1]}


def test_an_error_response_does_not_end_the_stream(server):
    client = grpcclient.InferenceServerClient(server.grpc_url)
    results: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    try:
        client.async_stream_infer("repeat", _n(grpcclient, -1), request_id="mixed")
        got = _collect(client, results, 3)
    finally:
        client.stop_stream()
    assert got[0][1] is None and int(got[0][0].as_numpy("I")[0]) == 0
    assert "negative counts are refused" in str(got[1][1])
    assert got[2][1] is None and int(got[2][0].as_numpy("I")[0]) == 1


@pytest.mark.parametrize("module", [httpclient, grpcclient], ids=["http", "grpc"])
def test_unary_inference_of_a_decoupled_model_is_refused(server, module):
    client = module.InferenceServerClient(server.url if module is httpclient else server.grpc_url)
    with pytest.raises(InferenceServerException) as e:
        client.infer("repeat", _n(module, 1))
    endpoint = "HTTP end point" if module is httpclient else "ModelInfer RPC"  # Triton's words, first
    assert e.value.message().startswith(f"{endpoint} doesn't support models with decoupled transaction policy")


def test_a_worker_dying_mid_stream_ends_the_stream_with_an_error(server):
    client = grpcclient.InferenceServerClient(server.grpc_url)
    results: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    try:
        client.async_stream_infer("repeat", _n(grpcclient, -2), request_id="dies")
        (first, error0), (_, error1) = _collect(client, results, 2)
        client.async_stream_infer("repeat", _n(grpcclient, 1), request_id="after")  # served after the restart
        ((after, error2),) = _collect(client, results, 1)
    finally:
        client.stop_stream()
    assert error0 is None and int(first.as_numpy("I")[0]) == 0
    assert "was killed by SIGKILL before sending its final response" in str(error1)
    assert error2 is None and int(after.as_numpy("I")[0]) == 0


def test_streamed_responses_carry_the_final_flag_and_the_empty_final_response_on_request(server):
    from conftest import stream_final_flags

    assert stream_final_flags(server.grpc_url) == [
        ("r0", "add_py", ["C"], True), ("r1", "add_py", ["C"], True),
        ("r2", "repeat", ["I"], False), ("r2", "repeat", ["I"], False),
        ("r3", "repeat", ["I"], False), ("r3", "repeat", ["I"], False), ("r3", "repeat", [], True),
        ("r4", "repeat", [], True)]


@pytest.mark.parametrize("engine", ["builtin", "grpcio"])
def test_stream_error_mode_ends_the_stream_with_the_errors_status(start_server, test_repo, engine):
    """With the metadata triton_grpc_error: true (newer Triton releases), the first error closes the
    stream with its own gRPC status; without it, errors travel inside the stream and it goes on."""
    server = start_server([test_repo], "--grpc-engine", engine)
    client = grpcclient.InferenceServerClient(server.grpc_url)
    for headers in ({"triton_grpc_error": "true"}, {}):
        results: queue.Queue = queue.Queue()
        client.start_stream(callback=lambda result, error, q=results: q.put((result, error)), headers=headers)
        try:
            client.async_stream_infer("repeat", _n(grpcclient, 1), request_id="ok")
            assert results.get(timeout=30)[1] is None
            client.async_stream_infer("no_such_model", _n(grpcclient, 1), request_id="bad")
            _, error = results.get(timeout=30)
            if headers:
                assert error.status() == "StatusCode.NOT_FOUND"
                assert error.message() == "Request for unknown model: 'no_such_model' is not found"
            else:
                assert error.status() is None and "unknown model" in error.message()
                client.async_stream_infer("repeat", _n(grpcclient, 1), request_id="after")
                assert results.get(timeout=30)[0].get_response().id == "after"
        finally:
            client.stop_stream()


POLICY_MODEL = """
import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.decoupled = pb_utils.using_decoupled_model_transaction_policy(json.loads(args["model_config"]))

    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("Y", np.array([float(self.decoupled)], np.float32))])
                for _ in requests]
"""


def test_a_model_can_ask_whether_it_is_decoupled(start_server, tmp_path):
    """As Triton's own lifecycle test models do, with the python backend's helper."""
    from conftest import X_TO_Y_CONFIG, write_model

    write_model(tmp_path / "repo", "policy", POLICY_MODEL, X_TO_Y_CONFIG)
    server = start_server([tmp_path / "repo"])
    x = httpclient.InferInput("X", [1], "FP32")
    x.set_data_from_numpy(np.zeros(1, np.float32))
    assert httpclient.InferenceServerClient(server.url).infer("policy", [x]).as_numpy("Y").tolist() == [0.0]
