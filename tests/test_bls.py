"""Python models calling other models of the server (BLS), with exec() and async_exec()."""

import shutil

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from conftest import X_TO_Y_CONFIG, write_model


def _call(server, target):
    client = httpclient.InferenceServerClient(server.url)
    a = np.array([[1.0, 2.0, 3.0]], np.float32)
    inputs = [httpclient.InferInput("A", [1, 3], "FP32"), httpclient.InferInput("TARGET", [1], "BYTES")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(np.array([target.encode()], dtype=object))
    return client.infer("bls", inputs).as_numpy("C")


@pytest.mark.parametrize("target", ["add", "add_py"], ids=["exec-onnx", "async_exec-python"])
def test_bls_reaches_other_models(server, target):
    np.testing.assert_array_equal(_call(server, target), np.array([[4.0, 8.0, 12.0]], np.float32))


def test_bls_error_comes_back_to_the_caller(server):
    with pytest.raises(InferenceServerException, match="Request for unknown model: 'nope' is not found"):
        _call(server, "nope")


def _stream_call(server, n, mode):
    client = httpclient.InferenceServerClient(server.url)
    try:
        inputs = [httpclient.InferInput("N", [1], "INT32"), httpclient.InferInput("MODE", [1], "BYTES")]
        inputs[0].set_data_from_numpy(np.array([n], np.int32))
        inputs[1].set_data_from_numpy(np.array([mode.encode()], dtype=object))
        result = client.infer("bls_stream", inputs)
        return (result.as_numpy("I").tolist(), int(result.as_numpy("EMPTY")[0]),
                [e.decode() for e in result.as_numpy("ERRORS")])
    finally:
        client.close()


def test_decoupled_bls_iterates_every_response_then_the_empty_final_one(server):
    assert _stream_call(server, 3, "exec") == ([0, 1, 2], 1, [])
    assert _stream_call(server, 0, "exec") == ([], 1, [])


def test_decoupled_bls_calls_run_at_once_with_async_exec(server):
    assert _stream_call(server, 2, "async") == ([0, 1, 0, 1, 2], 2, [])


def test_decoupled_bls_to_a_non_decoupled_model_yields_its_one_final_response(server):
    assert _stream_call(server, 0, "plain") == ([2, 2, 2], 0, [])


def test_cancelling_a_decoupled_bls_call_reaches_the_model_it_runs_on(server):
    values, empty, errors = _stream_call(server, -2, "cancel")  # two ticks, then ticker waits to be cancelled
    assert values == [0, 1]
    assert errors == ["cancelled"] and empty == 0  # the called model's own answer to the cancellation
    server.wait_until(lambda: "ticker: cancelled after" in server.log(), 30, "the ticker model to see is_cancelled()")


def test_a_cancelled_decoupled_bls_call_stays_open_while_the_called_model_ignores_it(server):
    """As current Triton: cancel() tells the called model; its responses still come until its final one."""
    assert _stream_call(server, 6, "cancel") == ([0, 1, 2, 3, 4, 5], 1, [])


def test_a_grpc_client_that_cancels_its_stream_reaches_the_model(server):
    import queue

    import tritonclient.grpc as grpcclient

    before = server.log().count("ticker: cancelled after")
    results: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    x = grpcclient.InferInput("N", [1], "INT32")
    x.set_data_from_numpy(np.array([-1], np.int32))  # one tick, then ticker waits to be cancelled
    client.async_stream_infer("ticker", [x])
    assert results.get(timeout=30)[1] is None
    client.stop_stream(cancel_requests=True)
    client.close()
    server.wait_until(lambda: server.log().count("ticker: cancelled after") > before, 30,
                      "the ticker model to see is_cancelled()")


def test_a_cancellation_reaches_a_model_while_it_executes(server):
    """The client cancels while execute() runs: the model sees is_cancelled() without returning first."""
    import queue

    import tritonclient.grpc as grpcclient

    started = server.log().count("cancellable: executing")
    before = server.log().count("cancellable: cancelled while executing")
    results: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        x = grpcclient.InferInput("N", [1], "INT32")
        x.set_data_from_numpy(np.array([1], np.int32))
        call = client.async_infer("cancellable", [x], callback=lambda result, error: results.put((result, error)))
        server.wait_until(lambda: server.log().count("cancellable: executing") > started, 30,
                          "the model to start executing")
        call.cancel()
        result, error = results.get(timeout=30)
        assert result is None and "CANCELLED" in str(error)
        server.wait_until(lambda: server.log().count("cancellable: cancelled while executing") > before, 30,
                          "the model to see is_cancelled() inside execute()")
    finally:
        client.close()


BLS_IN_PY = """
import numpy as np
import triton_python_backend_utils as pb_utils


def ask_add():
    request = pb_utils.InferenceRequest(model_name="add_py", requested_output_names=["C"],
                                        inputs=[pb_utils.Tensor("A", np.ones((1, 3), np.float32)),
                                                pb_utils.Tensor("B", np.ones((1, 3), np.float32))])
    return request.exec()


class TritonPythonModel:
    def initialize(self, args):
        if args["model_name"] == "bls_in_initialize":
            ask_add()

    def execute(self, requests):
        c = pb_utils.get_output_tensor_by_name(ask_add(), "C").as_numpy()
        return [pb_utils.InferenceResponse([pb_utils.Tensor("Y", c[0, :1])]) for _ in requests]

    def finalize(self):
        ask_add()
"""


def test_bls_outside_execute_is_refused_in_tritons_words(start_server, example_repo, tmp_path):
    """BLS during initialize() fails the load, during finalize() the model's error is logged at
    shutdown; in between (execute) it works. Triton's words in each."""
    repo = tmp_path / "repo"
    shutil.copytree(example_repo / "add_py", repo / "add_py")
    for name in ("bls_in_initialize", "bls_in_finalize"):
        write_model(repo, name, BLS_IN_PY, X_TO_Y_CONFIG)
    server = start_server([repo], "--model-control-mode=explicit", "--load-model=add_py")
    client = httpclient.InferenceServerClient(server.url)
    with pytest.raises(InferenceServerException, match="BLS is only supported during the 'execute' function."):
        client.load_model("bls_in_initialize")
    client.load_model("bls_in_finalize")
    x = httpclient.InferInput("X", [1], "FP32")
    x.set_data_from_numpy(np.zeros(1, np.float32))
    assert client.infer("bls_in_finalize", [x]).as_numpy("Y").tolist() == [2.0]  # in execute it works
    before = server.log().count("BLS is only supported during the 'execute' function.")
    client.unload_model("bls_in_finalize")
    server.wait_until(lambda: server.log().count("BLS is only supported during the 'execute' function.") > before,
                      30, "the finalize() error in the log")
    assert "in finalize" in server.log()  # the traceback names where it was raised
