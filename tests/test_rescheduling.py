"""Request rescheduling (`request.set_release_flags(TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)`) for
models with `sequence_batching { iterative_sequence: true }`, as Triton's python-backend
documentation shows it: a decoupled model that sends one response per execution, and a model that
runs a request several times before returning its one response."""

import json
import queue
import threading

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from conftest import serving, write_model

COUNTDOWN = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.remaining = {}

    def execute(self, requests):
        for request in requests:
            key = request.request_id()
            if key not in self.remaining:
                self.remaining[key] = int(pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()[0])
            self.remaining[key] -= 1
            sender = request.get_response_sender()
            out = pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([self.remaining[key]], np.int32))])
            if self.remaining[key] <= 0:
                del self.remaining[key]
                sender.send(out, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            else:
                request.set_release_flags(pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)
                sender.send(out)
        return None
"""

RUNS = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.runs = {}

    def execute(self, requests):
        responses = []
        for request in requests:
            key = request.request_id()
            self.runs[key] = self.runs.get(key, 0) + 1
            wanted = int(pb_utils.get_input_tensor_by_name(request, "IN").as_numpy().flatten()[0])
            if self.runs[key] < wanted:
                request.set_release_flags(pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)
                responses.append(None)
            else:
                runs = self.runs.pop(key)
                out = np.full((1, 1), runs * 100 + len(requests), np.int32)
                responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", out)]))
        return responses
"""


# reschedules its request and returns a response for it too, as Triton's qa wrong_return_type does
WRONG_RETURN = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            request.set_release_flags(pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.zeros((1, 1), np.int32))]) for _ in requests]
"""


def _config(batch: int, extra: str, iterative: bool = True) -> str:
    dims = "[ 1 ]"
    return (f'backend: "python"\nmax_batch_size: {batch}\n{extra}'
            + ("sequence_batching { iterative_sequence: true }\n" if iterative else "")
            + f'input [ {{ name: "IN", data_type: TYPE_INT32, dims: {dims} }} ]\n'
            f'output [ {{ name: "OUT", data_type: TYPE_INT32, dims: {dims} }} ]\n')


@pytest.fixture(scope="module")
def iterative_server(tmp_path_factory):
    repo = tmp_path_factory.mktemp("iterative") / "repo"
    write_model(repo, "countdown", COUNTDOWN, _config(0, "model_transaction_policy { decoupled: true }\n"))
    write_model(repo, "runs", RUNS, _config(4, ""))
    write_model(repo, "runs_plain", RUNS, _config(4, "", iterative=False))
    write_model(repo, "wrong_return", WRONG_RETURN, _config(4, ""))
    with serving([repo], [], tmp_path_factory) as s:
        yield s


def test_a_decoupled_model_sends_a_response_per_execution_until_it_stops_rescheduling(iterative_server):
    results: queue.Queue = queue.Queue()
    with grpcclient.InferenceServerClient(iterative_server.grpc_url) as client:
        client.start_stream(callback=lambda result, error: results.put((result, error)))
        for request_id, n in (("a", 3), ("b", 2)):
            x = grpcclient.InferInput("IN", [1], "INT32")
            x.set_data_from_numpy(np.array([n], np.int32))
            client.async_stream_infer("countdown", [x], request_id=request_id)
        client.stop_stream()  # returns once both requests have had their final response
    got: dict[str, list[int]] = {}
    while not results.empty():
        result, error = results.get()
        assert error is None, error
        got.setdefault(result.get_response().id, []).append(int(result.as_numpy("OUT")[0]))
    assert got == {"a": [2, 1, 0], "b": [1, 0]}


def _runs(server, model, request_id, n):
    body = json.dumps({"id": request_id,
                       "inputs": [{"name": "IN", "datatype": "INT32", "shape": [1, 1], "data": [n]}]}).encode()
    status, _, data = server.post(f"/v2/models/{model}/infer", body)
    return status, json.loads(data)


def test_a_model_runs_a_request_again_until_it_returns_its_response(iterative_server):
    status, data = _runs(iterative_server, "runs", "once", 1)
    assert status == 200 and data["outputs"][0]["data"][0] // 100 == 1
    status, data = _runs(iterative_server, "runs", "thrice", 3)
    assert status == 200 and data["outputs"][0]["data"][0] // 100 == 3


def test_iterative_requests_in_flight_together_each_run_their_own_count(iterative_server):
    answers = {}

    def call(request_id, n):
        answers[request_id] = _runs(iterative_server, "runs", request_id, n)

    threads = [threading.Thread(target=call, args=(f"r{n}", n)) for n in (2, 3, 5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert {k: (status, data["outputs"][0]["data"][0] // 100) for k, (status, data) in answers.items()} == {
        "r2": (200, 2), "r3": (200, 3), "r5": (200, 5)}


def test_rescheduling_without_an_iterative_sequence_config_is_an_error(iterative_server):
    status, data = _runs(iterative_server, "runs_plain", "x", 2)
    assert status == 500
    assert "needs `sequence_batching { iterative_sequence: true }`" in data["error"]


def test_a_response_returned_for_a_rescheduled_request_is_an_error_in_tritons_words(iterative_server):
    status, data = _runs(iterative_server, "wrong_return", "x", 1)
    assert status == 500
    assert "Expected a None object in the execute function return list for reschduled request, found type " \
        in data["error"]


def test_an_iterative_sequence_for_a_framework_backend_is_refused_saying_why(tmp_path):
    import subprocess

    from conftest import TRITONMP
    from make_example_repo import binary_op_model, write

    write(binary_op_model("Add"), str(tmp_path / "iterative_onnx" / "1" / "model.onnx"))
    (tmp_path / "iterative_onnx" / "config.pbtxt").write_text(
        'backend: "onnxruntime"\nmax_batch_size: 4\nsequence_batching { iterative_sequence: true }\n'
        'input [ { name: "A", data_type: TYPE_FP32, dims: [ 3 ] }, { name: "B", data_type: TYPE_FP32, dims: [ 3 ] } ]\n'
        'output [ { name: "C", data_type: TYPE_FP32, dims: [ 3 ] } ]\n')
    out = subprocess.run([*TRITONMP, "check", str(tmp_path)], capture_output=True, text=True, timeout=120).stdout
    assert ("iterative_onnx/config.pbtxt: sequence_batching.iterative_sequence: not served for the onnxruntime's "
            "backend: an iterative sequence runs for as long as its model reschedules its request, and only a python "
            "model can") in out
