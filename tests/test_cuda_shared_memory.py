"""CUDA shared memory: registration checks and errors everywhere (with a faked GPU list), and real
device memory through a KIND_GPU instance where a GPU exists (scripts/gpu-check.sh)."""

import base64
import os
import shutil

import numpy as np
import orjson
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tritonmp.gpus import visible_gpus

FAKE_HANDLE = base64.b64encode(bytes(64)).decode()


@pytest.fixture
def fake_gpu_server(start_server, example_repo, tmp_path, monkeypatch):
    monkeypatch.setenv("TRITONMP_FAKE_GPUS", "0")
    shutil.copytree(example_repo / "add_py", tmp_path / "repo" / "add_py")  # a KIND_CPU model
    return start_server([tmp_path / "repo"], "--allow-client-shm=true")


def _register(server, name, **body):
    doc = {"raw_handle": {"b64": FAKE_HANDLE}, "device_id": 0, "byte_size": 64, **body}
    return server.post(f"/v2/cudasharedmemory/region/{name}/register", orjson.dumps(doc))


def test_register_status_unregister(fake_gpu_server):
    server = fake_gpu_server
    assert _register(server, "c0")[0] == 200
    client = httpclient.InferenceServerClient(server.url)
    assert client.get_cuda_shared_memory_status() == [{"name": "c0", "device_id": 0, "byte_size": 64}]
    assert client.get_system_shared_memory_status() == []  # kinds are listed apart
    g = grpcclient.InferenceServerClient(server.grpc_url)
    assert g.get_cuda_shared_memory_status(as_json=True)["regions"]["c0"]["byte_size"] == "64"
    status, _, raw = _register(server, "c0")
    assert status == 400 and "already in manager" in orjson.loads(raw)["error"]
    with pytest.raises(InferenceServerException) as e:
        g.register_cuda_shared_memory("c0", bytes(64), 0, 64)
    assert e.value.status() == "StatusCode.ALREADY_EXISTS"
    g.unregister_cuda_shared_memory("c0")
    assert client.get_cuda_shared_memory_status() == []


@pytest.mark.parametrize("body,message", [
    ({"raw_handle": {"b64": base64.b64encode(bytes(10)).decode()}},
     "'raw_handle' must be a valid base64 encoded cudaIpcMemHandle_t"),
    ({"device_id": 3}, "failed to register shared memory region: invalid args (CUDA shared memory region 'bad': "
                       "GPU 3 is not visible to this server"),
    ({"raw_handle": "not-base64-object"}, "'raw_handle' must be a valid base64 encoded cudaIpcMemHandle_t"),
    ({"raw_handle": {"b64": ""}}, "'raw_handle' must be a valid base64 encoded cudaIpcMemHandle_t"),
    ({"byte_size": 0}, "needs a byte_size > 0"),
])
def test_registration_errors(fake_gpu_server, body, message):
    status, _, raw = _register(fake_gpu_server, "bad", **body)
    assert status == 400
    assert message in orjson.loads(raw)["error"]


def test_a_handle_of_the_wrong_size_over_grpc_is_refused_in_tritons_words(fake_gpu_server):
    """gRPC takes any bytes as the handle (Triton's HTTP frontend checks the size, its gRPC one does
    not): the registration fails as Triton's does, INVALID_ARGUMENT "...: invalid args"."""
    g = grpcclient.InferenceServerClient(fake_gpu_server.grpc_url)
    with pytest.raises(InferenceServerException) as e:
        g.register_cuda_shared_memory("short", base64.b64encode(bytes(10)), 0, 64)
    assert e.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert e.value.message().startswith("failed to register shared memory region: invalid args")


def test_cpu_instance_cannot_use_a_cuda_region(fake_gpu_server):
    server = fake_gpu_server
    assert _register(server, "gpu_in")[0] == 200
    body = orjson.dumps({"inputs": [
        {"name": "A", "shape": [1, 3], "datatype": "FP32",
         "parameters": {"shared_memory_region": "gpu_in", "shared_memory_byte_size": 12}},
        {"name": "B", "shape": [1, 3], "datatype": "FP32", "data": [1, 2, 3]}]})
    status, _, raw = server.post("/v2/models/add_py/infer", body)
    assert status == 500
    assert "cannot be used by model instance 'add_py_0_0', which runs on the CPU" in orjson.loads(raw)["error"]
    # the window is still bounds-checked first
    status, _, raw = server.post("/v2/models/add_py/infer", body.replace(b'"shared_memory_byte_size":12',
                                                                        b'"shared_memory_byte_size":72'))
    assert status == 400 and "Invalid offset + byte size" in orjson.loads(raw)["error"]


needs_gpu = pytest.mark.skipif(not visible_gpus() or os.environ.get("TRITONMP_FAKE_GPUS") is not None,
                               reason="no NVIDIA GPU visible on this machine")


def _kind_gpu_add(repo, framework: str, example_repo) -> None:
    """An add model on a KIND_GPU instance: ONNX on onnxruntime's CUDA provider, or a python model
    (whose worker moves the tensors between the client's device memory and the host)."""
    if framework == "onnx":
        ort = pytest.importorskip("onnxruntime")
        if "CUDAExecutionProvider" not in ort.get_available_providers():
            pytest.skip("onnxruntime here has no CUDAExecutionProvider (install tritonmp[gpu])")
        from make_example_repo import binary_op_model, write

        write(binary_op_model("Add"), str(repo / "add_gpu" / "1" / "model.onnx"))
        (repo / "add_gpu" / "config.pbtxt").write_text(
            'platform: "onnxruntime_onnx"\nmax_batch_size: 8\ninstance_group [ { kind: KIND_GPU, gpus: [ 0 ] } ]\n')
    else:
        shutil.copytree(example_repo / "add_py", repo / "add_gpu")
        config = repo / "add_gpu" / "config.pbtxt"
        text = config.read_text().replace('name: "add_py"', 'name: "add_gpu"')
        config.write_text(text.replace("kind: KIND_CPU", "kind: KIND_GPU, gpus: [ 0 ]"))


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("framework", ["onnx", "python"])
@pytest.mark.parametrize("module", [httpclient, grpcclient], ids=["http", "grpc"])
def test_inputs_and_outputs_in_device_memory(start_server, tmp_path, example_repo, module, framework):
    cudashm = pytest.importorskip("tritonclient.utils.cuda_shared_memory",
                                  reason="needs cuda-python (install tritonmp[gpu])")
    repo = tmp_path / "gpu"
    _kind_gpu_add(repo, framework, example_repo)
    server = start_server([repo], "--allow-client-shm=true")
    client = module.InferenceServerClient(server.url if module is httpclient else server.grpc_url)
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    inp = cudashm.create_shared_memory_region("in", 2 * a.nbytes, 0)
    out = cudashm.create_shared_memory_region("out", a.nbytes, 0)
    try:
        cudashm.set_shared_memory_region(inp, [a, a * 10])
        client.register_cuda_shared_memory("in", cudashm.get_raw_handle(inp), 0, 2 * a.nbytes)
        client.register_cuda_shared_memory("out", cudashm.get_raw_handle(out), 0, a.nbytes)
        inputs = [module.InferInput("A", [2, 3], "FP32"), module.InferInput("B", [2, 3], "FP32")]
        inputs[0].set_shared_memory("in", a.nbytes)
        inputs[1].set_shared_memory("in", a.nbytes, offset=a.nbytes)
        outputs = [module.InferRequestedOutput("C")]
        outputs[0].set_shared_memory("out", a.nbytes)
        client.infer("add_gpu", inputs, outputs=outputs)
        np.testing.assert_array_equal(cudashm.get_contents_as_numpy(out, np.float32, [2, 3]), a * 11)
    finally:
        client.unregister_cuda_shared_memory()
        cudashm.destroy_shared_memory_region(inp)
        cudashm.destroy_shared_memory_region(out)
