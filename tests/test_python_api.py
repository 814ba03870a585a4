"""The python backend's API beyond the common path, used the way Triton's documentation shows."""

import re

import numpy as np
import pytest
import tritonclient.http as httpclient

from conftest import X_TO_Y_CONFIG, write_model

DLPACK_MODEL = """
import numpy as np
import torch
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X")
            doubled = torch.from_dlpack(x) * 2  # the input's own memory, through __dlpack__
            y = pb_utils.Tensor.from_dlpack("Y", doubled)  # a producer object
            back = pb_utils.Tensor.from_dlpack("Y", y.to_dlpack())  # and a bare capsule
            assert x.__dlpack_device__() == (1, 0) and back.is_cpu()
            responses.append(pb_utils.InferenceResponse([back]))
        return responses
"""


def test_tensors_go_through_dlpack(start_server, tmp_path):
    pytest.importorskip("torch", reason="torch is not installed (pip install 'tritonmp[torch]')")
    write_model(tmp_path / "repo", "dlpack", DLPACK_MODEL, X_TO_Y_CONFIG)
    server = start_server([tmp_path / "repo"])
    x = httpclient.InferInput("X", [1], "FP32")
    x.set_data_from_numpy(np.array([21.0], np.float32))
    client = httpclient.InferenceServerClient(server.url)
    try:
        assert client.infer("dlpack", [x]).as_numpy("Y").tolist() == [42.0]
    finally:
        client.close()  # here, not by the garbage collector in some other thread


CONTROL_MODEL = """
import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        seen = [pb_utils.is_model_ready("add"), pb_utils.is_model_ready("add", "1"), pb_utils.is_model_ready("nope")]
        pb_utils.unload_model("add")
        seen.append(pb_utils.is_model_ready("add"))
        config = json.dumps({"platform": "onnxruntime_onnx", "max_batch_size": 2})
        with open(self.onnx, "rb") as f:
            pb_utils.load_model("added", config=config, files={"file:1/model.onnx": f.read()})
        seen.append(pb_utils.is_model_ready("added"))
        try:
            pb_utils.load_model("nope")
        except pb_utils.TritonModelException as e:
            seen.append("failed to load 'nope'" in str(e))
        return [pb_utils.InferenceResponse([pb_utils.Tensor("Y", np.array(seen, np.float32))]) for _ in requests]

    def initialize(self, args):
        import os

        self.onnx = os.path.join(args["model_repository"], "add.onnx")  # shipped beside the model
"""
CONTROL_CONFIG = ('backend: "python"\nmax_batch_size: 0\ninput [ { name: "X", data_type: TYPE_FP32, dims: [ 1 ] } ]\n'
                  'output [ { name: "Y", data_type: TYPE_FP32, dims: [ -1 ] } ]\n')


def test_a_model_checks_loads_and_unloads_models(start_server, tmp_path, example_repo):
    import shutil

    repo = tmp_path / "repo"
    shutil.copytree(example_repo / "add", repo / "add")
    write_model(repo, "controller", CONTROL_MODEL, CONTROL_CONFIG)
    shutil.copy(example_repo / "add" / "1" / "model.onnx", repo / "controller" / "add.onnx")
    server = start_server([repo], "--model-control-mode=explicit", "--load-model=add", "--load-model=controller")
    client = httpclient.InferenceServerClient(server.url)
    x = httpclient.InferInput("X", [1], "FP32")
    x.set_data_from_numpy(np.zeros(1, np.float32))
    try:
        assert client.infer("controller", [x]).as_numpy("Y").tolist() == [1, 1, 0, 0, 1, 1]
        assert not client.is_model_ready("add") and client.is_model_ready("added")
        assert client.get_model_config("added")["max_batch_size"] == 2
    finally:
        client.close()


NAMES_MODEL = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X")
            # a BLS request that carries this request's trace and prefers its outputs in CPU memory
            bls = pb_utils.InferenceRequest(
                model_name="add_py", inputs=[pb_utils.Tensor("A", np.ones((1, 3), np.float32)),
                                             pb_utils.Tensor("B", np.ones((1, 3), np.float32))],
                requested_output_names=["C"], trace=request.trace(),
                preferred_memory=pb_utils.PreferredMemory(pb_utils.TRITONSERVER_MEMORY_CPU, 0))
            c = bls.exec().output_tensors()[0]
            assert c.is_cpu() and c.as_numpy().tolist() == [[2.0, 2.0, 2.0]]
            assert request.trace().get_context() is None  # no OpenTelemetry context to hand on
            assert pb_utils.MemoryType.TRITONSERVER_MEMORY_GPU != pb_utils.TRITONSERVER_MEMORY_CPU
            free = pb_utils.SharedMemory().free_memory()
            assert free > 0, free
            pb_utils.Logger.log("names model: at warning level", pb_utils.Logger.WARNING)
            pb_utils.Logger.log("names model: at info level", pb_utils.LogLevel.INFO)
            assert not request.is_cancelled() and not pb_utils.using_decoupled_model_transaction_policy({})
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", x.as_numpy() + 1)]))
        return responses
"""


def test_the_rest_of_the_python_backend_api_is_there(start_server, tmp_path, example_repo):
    write_model(tmp_path / "repo", "names", NAMES_MODEL, X_TO_Y_CONFIG)
    server = start_server([tmp_path / "repo", example_repo])
    x = httpclient.InferInput("X", [1], "FP32")
    x.set_data_from_numpy(np.array([41.0], np.float32))
    client = httpclient.InferenceServerClient(server.url)
    try:
        assert client.infer("names", [x]).as_numpy("Y").tolist() == [42.0]
    finally:
        client.close()
    # the server's log layout, under the logger of the model's instance
    assert re.search(r"^W\d{4} [\d:.]+ \d+ tritonmp\.model\.names_0\] names model: at warning level$", server.log(),
                     re.M)
    assert re.search(r"^I\d{4} [\d:.]+ \d+ tritonmp\.model\.names_0\] names model: at info level$", server.log(),
                     re.M)


PARAMETERS_MODEL = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            params = {"doubled": True, "count": 2, "note": "from the model"}
            response = pb_utils.InferenceResponse([pb_utils.Tensor("Y", x * 2)], parameters=params)
            assert response.parameters() == '{"doubled":true,"count":2,"note":"from the model"}'
            responses.append(response)
        return responses
"""


def test_response_parameters_reach_http_and_grpc_clients(start_server, tmp_path):
    import tritonclient.grpc as grpcclient

    write_model(tmp_path / "repo", "params", PARAMETERS_MODEL, X_TO_Y_CONFIG)
    server = start_server([tmp_path / "repo"])
    expected = {"doubled": True, "count": 2, "note": "from the model"}
    x = httpclient.InferInput("X", [1], "FP32")
    x.set_data_from_numpy(np.array([21.0], np.float32))
    client = httpclient.InferenceServerClient(server.url)
    try:
        assert client.infer("params", [x]).get_response()["parameters"] == expected
    finally:
        client.close()
    g = grpcclient.InferInput("X", [1], "FP32")
    g.set_data_from_numpy(np.array([21.0], np.float32))
    with grpcclient.InferenceServerClient(server.grpc_url) as grpc:
        params = grpc.infer("params", [g]).get_response().parameters
    assert (params["doubled"].bool_param, params["count"].int64_param, params["note"].string_param) == (
        True, 2, "from the model")


ECHO_PARAMETERS_MODEL = """
import json

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("Y", pb_utils.get_input_tensor_by_name(r, "X").as_numpy())],
                                           parameters=json.loads(r.parameters())) for r in requests]
"""


def test_a_model_sees_its_clients_parameters_but_not_tritons_own(start_server, tmp_path):
    """triton_enable_empty_final_response is the gRPC frontend's (Triton keeps its reserved
    parameters from the model too); the client's own parameters reach the model as they were sent."""
    import grpc
    from tritonclient.grpc import service_pb2 as pb
    from tritonclient.grpc import service_pb2_grpc as rpc

    write_model(tmp_path / "repo", "echo", ECHO_PARAMETERS_MODEL, X_TO_Y_CONFIG)
    server = start_server([tmp_path / "repo"])
    request = pb.ModelInferRequest(model_name="echo")
    request.inputs.add(name="X", datatype="FP32", shape=[1])
    request.raw_input_contents.append(np.array([1.0], np.float32).tobytes())
    request.parameters["mine"].int64_param = 5
    request.parameters["triton_enable_empty_final_response"].bool_param = True
    with grpc.insecure_channel(server.grpc_url) as channel:
        answer = rpc.GRPCInferenceServiceStub(channel).ModelInfer(request, timeout=30)
    assert {key: value.int64_param for key, value in answer.parameters.items()} == {"mine": 5}


GPU_TENSORS_MODEL = """
import numpy as np
import torch
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            ones = np.ones((1, 3), np.float32)
            bls = pb_utils.InferenceRequest(
                model_name="add_py", inputs=[pb_utils.Tensor("A", ones), pb_utils.Tensor("B", ones)],
                requested_output_names=["C"],
                preferred_memory=pb_utils.PreferredMemory(pb_utils.TRITONSERVER_MEMORY_GPU, 0))
            c = bls.exec().output_tensors()[0]
            assert not c.is_cpu() and c.__dlpack_device__()[0] == 2
            try:
                c.as_numpy()
                raise AssertionError("as_numpy() of a GPU tensor must raise")
            except pb_utils.TritonModelException:
                pass
            on_gpu = torch.from_dlpack(c)  # the same GPU memory
            x = torch.from_numpy(pb_utils.get_input_tensor_by_name(request, "X").as_numpy()).cuda()
            y = pb_utils.Tensor.from_dlpack("Y", x + on_gpu.sum())  # a GPU output, copied out to the client
            assert not y.is_cpu()
            responses.append(pb_utils.InferenceResponse([y]))
        return responses
"""


@pytest.mark.gpu
def test_gpu_tensors_through_dlpack_and_preferred_memory(start_server, tmp_path, example_repo):
    torch = pytest.importorskip("torch", reason="torch is not installed (pip install 'tritonmp[torch]')")
    if not torch.cuda.is_available():
        pytest.skip("no GPU that torch can use here")
    write_model(tmp_path / "repo", "gpu_tensors", GPU_TENSORS_MODEL, X_TO_Y_CONFIG)
    server = start_server([tmp_path / "repo", example_repo])
    x = httpclient.InferInput("X", [1], "FP32")
    x.set_data_from_numpy(np.array([36.0], np.float32))
    client = httpclient.InferenceServerClient(server.url)
    try:
        assert client.infer("gpu_tensors", [x]).as_numpy("Y").tolist() == [42.0]
    finally:
        client.close()


SIBLINGS_PY = """
import file1
import triton_python_backend_utils as pb_utils

from . import file2


class TritonPythonModel:
    @staticmethod
    def auto_complete_config(config):
        config.set_max_batch_size(file1.BATCH)  # the imports work when the config is completed too
        return config

    def initialize(self, args):
        if file1.FILE_NAME != "FILE1" or file2.FILE_NAME != "FILE2":
            raise pb_utils.TritonModelException("Imports do not work")

    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("Y", file2.twice(
            pb_utils.get_input_tensor_by_name(r, "X").as_numpy()))]) for r in requests]
"""


def test_model_py_imports_the_files_beside_it_as_triton_loads_it(start_server, tmp_path):
    """Triton's qa multi_file model: `import file1` (a file beside model.py) and `from . import file2`
    (model.py's own package), at auto-complete and when the model loads."""
    model = write_model(tmp_path / "repo", "multi_file", SIBLINGS_PY,
                        'backend: "python"\ninput [ { name: "X", data_type: TYPE_FP32, dims: [ 1 ] } ]\n'
                        'output [ { name: "Y", data_type: TYPE_FP32, dims: [ 1 ] } ]\n')
    (model / "1" / "file1.py").write_text('FILE_NAME = "FILE1"\nBATCH = 4\n')
    (model / "1" / "file2.py").write_text('FILE_NAME = "FILE2"\n\n\ndef twice(x):\n    return x * 2\n')
    server = start_server([tmp_path / "repo"])
    client = httpclient.InferenceServerClient(server.url)
    assert client.get_model_config("multi_file")["max_batch_size"] == 4
    x = httpclient.InferInput("X", [2, 1], "FP32")
    x.set_data_from_numpy(np.array([[1.5], [2.0]], np.float32))
    np.testing.assert_array_equal(client.infer("multi_file", [x]).as_numpy("Y"), [[3.0], [4.0]])


def test_pb_utils_checks_its_arguments_as_tritons_bindings_do():
    """Triton's qa argument_validation: a wrong type is a TypeError, a None where a Tensor belongs in a
    list is TritonModelException, and what is allowed (empty lists, string correlation IDs) works."""
    from tritonmp.workers import pb_utils

    ok = [pb_utils.Tensor("INPUT0", np.asarray([1, 2], np.int32))]
    request = {"inputs": ok, "model_name": "m", "requested_output_names": ["o"]}
    for change in ({"inputs": None}, {"model_name": None}, {"requested_output_names": [None]},
                   {"requested_output_names": None}, {"correlation_id": None}, {"request_id": None},
                   {"model_version": None}, {"flags": None}):
        with pytest.raises(TypeError):
            pb_utils.InferenceRequest(**{**request, **change})
    with pytest.raises(pb_utils.TritonModelException):
        pb_utils.InferenceRequest(**{**request, "inputs": [None]})
    assert pb_utils.InferenceRequest(**request, correlation_id="id-5").correlation_id() == "id-5"
    assert pb_utils.InferenceRequest(**request).correlation_id() == 0
    pb_utils.InferenceRequest(requested_output_names=[], inputs=[], model_name="m")
    with pytest.raises(pb_utils.TritonModelException):
        pb_utils.InferenceResponse(output_tensors=[None])
    with pytest.raises(TypeError):
        pb_utils.InferenceResponse(output_tensors=None)
    pb_utils.InferenceResponse(output_tensors=[])
    pb_utils.InferenceResponse(ok)
    for name, tensor in ((None, np.asarray([1])), ("OUTPUT0", None), ("", None)):
        with pytest.raises(TypeError):
            pb_utils.Tensor(name, tensor)
    for name in ("OUTPUT0", ""):
        with pytest.raises(pb_utils.TritonModelException):
            pb_utils.Tensor.from_dlpack(name, None)
    for call in (lambda: pb_utils.Logger.log("x", None), lambda: pb_utils.Logger.log("x", 1),
                 lambda: pb_utils.Logger.log_info(None), lambda: pb_utils.Logger.log_warn(None)):
        with pytest.raises(TypeError):
            call()
