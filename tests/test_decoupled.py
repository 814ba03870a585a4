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
    from probes import stream_final_flags

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


GATE_PY = """
import asyncio

import numpy as np
import triton_python_backend_utils as pb_utils

OPENED = None  # set by a request that says "open"; a "wait" request waits for it


class TritonPythonModel:
    async def execute(self, requests):
        global OPENED
        if OPENED is None:
            OPENED = asyncio.Event()
        for request in requests:
            what = pb_utils.get_input_tensor_by_name(request, "WHAT").as_numpy()[0].decode()
            sender = request.get_response_sender()
            if what == "open":
                OPENED.set()
            elif what == "wait":  # answered only once another call of execute() has run
                try:
                    await asyncio.wait_for(OPENED.wait(), 30)
                except asyncio.TimeoutError:
                    what = "never opened"
            elif what == "raise":
                raise ValueError("the model gave up")
            sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("SAID", np.array([what.encode()], object))]),
                        flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""

# forwards each request to `gate` with a decoupled BLS call made by async_exec, and relays its responses
GATE_BLS_PY = """
import asyncio

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    async def relay(self, request):
        call = pb_utils.InferenceRequest(model_name="gate", requested_output_names=["SAID"],
                                         inputs=[pb_utils.get_input_tensor_by_name(request, "WHAT")])
        sender = request.get_response_sender()
        for response in await call.async_exec(decoupled=True):
            said = pb_utils.get_output_tensor_by_name(response, "SAID")
            if said is not None:
                sender.send(pb_utils.InferenceResponse([said]))
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    async def execute(self, requests):
        await asyncio.gather(*(self.relay(r) for r in requests))
        return None
"""

GATE_CONFIG = ('backend: "python"\nmax_batch_size: 0\nmodel_transaction_policy { decoupled: true }\n'
               'input [ { name: "WHAT", data_type: TYPE_STRING, dims: [ 1 ] } ]\n'
               'output [ { name: "SAID", data_type: TYPE_STRING, dims: [ 1 ] } ]\n')


@pytest.mark.parametrize("model", ["gate", "gate_bls"])
def test_a_decoupled_async_execute_runs_in_the_background(start_server, tmp_path, model):
    """As Triton runs a decoupled model's `async def execute`: the next call starts while one awaits.
    "wait" is answered only once the "open" sent after it has run; directly, and through a decoupled BLS
    call made with async_exec (which returns once the first response has come, leaving the model's
    event loop free)."""
    from conftest import write_model

    repo = tmp_path / "repo"
    write_model(repo, "gate", GATE_PY, GATE_CONFIG)
    write_model(repo, "gate_bls", GATE_BLS_PY, GATE_CONFIG)
    server = start_server([repo])
    client = grpcclient.InferenceServerClient(server.grpc_url)
    results: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    try:
        for what in ("wait", "open"):
            x = grpcclient.InferInput("WHAT", [1], "BYTES")
            x.set_data_from_numpy(np.array([what.encode()], object))
            client.async_stream_infer(model, [x])
        said = []
        for _ in range(2):
            result, error = results.get(timeout=60)
            assert error is None, error
            said.append(result.as_numpy("SAID")[0].decode())
    finally:
        client.stop_stream()
    assert sorted(said) == ["open", "wait"], said  # not "never opened"


def test_what_a_decoupled_async_execute_raises_is_logged_and_ends_its_requests(start_server, tmp_path):
    from conftest import write_model

    write_model(tmp_path / "repo", "gate", GATE_PY, GATE_CONFIG)
    server = start_server([tmp_path / "repo"])
    client = grpcclient.InferenceServerClient(server.grpc_url)
    results: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    try:
        x = grpcclient.InferInput("WHAT", [1], "BYTES")
        x.set_data_from_numpy(np.array([b"raise"], object))
        client.async_stream_infer("gate", [x])
        _, error = results.get(timeout=30)
    finally:
        client.stop_stream()
    assert error is not None and "Failed to process the request(s) for model 'gate_0', message: ValueError: " \
        "the model gave up" in error.message()
    server.wait_until(lambda: "ValueError: the model gave up" in server.log(), 30, "the model's error in the log")
    assert "Traceback" in server.log()  # with where it was raised
