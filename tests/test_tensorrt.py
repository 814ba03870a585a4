"""TensorRT: engines built at test time from the tutorial ONNX model with TensorRT's own builder,
served on a GPU (scripts/gpu-check.sh), and onnxruntime's execution accelerators: the TensorRT
provider on a GPU, and on any machine the clear load error where a provider is not installed."""

from __future__ import annotations

import importlib.util
import os

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tritonmp.gpus import visible_gpus

from conftest import add_inputs
from make_example_repo import binary_op_model, write

needs_gpu = pytest.mark.skipif(not visible_gpus() or os.environ.get("TRITONMP_FAKE_GPUS") is not None,
                               reason="no NVIDIA GPU visible on this machine")


def _accelerated(repo, name: str, kind: str, accelerators: str) -> None:
    write(binary_op_model("Add"), str(repo / name / "1" / "model.onnx"))
    (repo / name / "config.pbtxt").write_text(
        f'platform: "onnxruntime_onnx"\nmax_batch_size: 8\ninstance_group [ {{ kind: {kind} }} ]\n'
        f'optimization {{ execution_accelerators {{ {accelerators} }} }}\n')


def test_missing_execution_provider_fails_the_load_with_its_package(start_server, tmp_path):
    import onnxruntime

    if "OpenVINOExecutionProvider" in onnxruntime.get_available_providers():
        pytest.skip("this onnxruntime has the OpenVINO provider")
    repo = tmp_path / "repo"
    _accelerated(repo, "ov_ep", "KIND_CPU", 'cpu_execution_accelerator : [ { name : "openvino" } ]')
    _accelerated(repo, "bogus_ep", "KIND_CPU", 'cpu_execution_accelerator : [ { name : "turbo" } ]')
    server = start_server([repo], "--model-control-mode", "explicit")
    client = httpclient.InferenceServerClient(server.url)
    with pytest.raises(InferenceServerException) as e:
        client.load_model("ov_ep")
    assert ("execution accelerator 'openvino' needs onnxruntime's OpenVINOExecutionProvider, which this "
            "onnxruntime build lacks; it comes with onnxruntime-openvino") in e.value.message()
    with pytest.raises(InferenceServerException) as e:
        client.load_model("bogus_ep")
    assert "unknown CPU execution accelerator 'turbo' for onnxruntime (known: openvino)" in e.value.message()
    assert not client.is_model_ready("ov_ep")


def test_plan_without_tensorrt_names_the_extra(tmp_path):
    if importlib.util.find_spec("tensorrt") is not None:
        pytest.skip("tensorrt is installed here")
    from test_config import _check

    (tmp_path / "repo" / "engine" / "1").mkdir(parents=True)
    (tmp_path / "repo" / "engine" / "1" / "model.plan").write_bytes(b"plan")
    result = _check(tmp_path / "repo")
    assert result.returncode == 1
    assert "pip install 'tritonmp[tensorrt]'" in result.stdout


def _build_engine(onnx_path, plan_path, max_batch: int = 8) -> None:
    """A TensorRT engine of the tutorial add model, with one profile for batches 1..max_batch."""
    trt = pytest.importorskip("tensorrt", reason="tensorrt is not installed (pip install 'tritonmp[tensorrt]')")
    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    network = builder.create_network(0)
    parser = trt.OnnxParser(network, logger)
    assert parser.parse(onnx_path.read_bytes()), [parser.get_error(i) for i in range(parser.num_errors)]
    config = builder.create_builder_config()
    profile = builder.create_optimization_profile()
    for name in ("A", "B"):
        profile.set_shape(name, (1, 3), (max_batch // 2, 3), (max_batch, 3))
    config.add_optimization_profile(profile)
    plan = builder.build_serialized_network(network, config)
    assert plan is not None
    plan_path.parent.mkdir(parents=True, exist_ok=True)
    plan_path.write_bytes(bytes(plan))


@pytest.mark.gpu
@needs_gpu
def test_tensorrt_engine_serves_batches_and_shared_memory(start_server, tmp_path):
    repo = tmp_path / "repo"
    write(binary_op_model("Add"), str(tmp_path / "add.onnx"))
    _build_engine(tmp_path / "add.onnx", repo / "add_trt" / "1" / "model.plan")
    # tensors and max_batch_size are completed from the engine
    (repo / "add_trt" / "config.pbtxt").write_text('platform: "tensorrt_plan"\ninstance_group [ { kind: KIND_GPU } ]\n')
    (repo / "bad_plan" / "1").mkdir(parents=True)
    (repo / "bad_plan" / "1" / "model.plan").write_bytes(b"not an engine")
    server = start_server([repo], "--model-control-mode", "explicit", "--load-model", "add_trt",
                          "--allow-client-shm=true")
    http = httpclient.InferenceServerClient(server.url)
    config = http.get_model_config("add_trt")
    assert config["platform"] == "tensorrt_plan" and config["max_batch_size"] == 8
    a = np.arange(12, dtype=np.float32).reshape(4, 3)
    for module, url in ((httpclient, server.url), (grpcclient, server.grpc_url)):
        result = module.InferenceServerClient(url).infer("add_trt", add_inputs(module, a, a + 1))
        np.testing.assert_array_equal(result.as_numpy("C"), 2 * a + 1)
    with pytest.raises(InferenceServerException) as e:
        http.infer("add_trt", add_inputs(httpclient, np.ones((1, 4), np.float32)))
    assert e.value.status() == "400"
    with pytest.raises(InferenceServerException) as e:
        http.load_model("bad_plan")
    assert "TensorRT cannot deserialize the plan" in e.value.message()
    # outputs straight into the client's CUDA region
    cudashm = pytest.importorskip("tritonclient.utils.cuda_shared_memory", reason="needs cuda-python")
    out = cudashm.create_shared_memory_region("trt_out", a.nbytes, 0)
    try:
        http.register_cuda_shared_memory("trt_out", cudashm.get_raw_handle(out), 0, a.nbytes)
        outputs = [httpclient.InferRequestedOutput("C")]
        outputs[0].set_shared_memory("trt_out", a.nbytes)
        http.infer("add_trt", add_inputs(httpclient, a), outputs=outputs)
        np.testing.assert_array_equal(cudashm.get_contents_as_numpy(out, np.float32, [4, 3]), 2 * a)
    finally:
        http.unregister_cuda_shared_memory()
        cudashm.destroy_shared_memory_region(out)


@pytest.mark.gpu
@needs_gpu
def test_onnxruntime_tensorrt_provider(start_server, tmp_path):
    import onnxruntime

    if "TensorrtExecutionProvider" not in onnxruntime.get_available_providers():
        pytest.skip("this onnxruntime has no TensorRT provider")
    repo = tmp_path / "repo"
    _accelerated(repo, "add_ort_trt", "KIND_GPU",
                 'gpu_execution_accelerator : [ { name : "tensorrt" parameters { key: "precision_mode" '
                 'value: "FP16" } parameters { key: "trt_engine_cache_enable" value: "true" } '
                 f'parameters {{ key: "trt_engine_cache_path" value: "{tmp_path}" }} }} ]')
    server = start_server([repo])
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    result = httpclient.InferenceServerClient(server.url).infer("add_ort_trt", add_inputs(httpclient, a))
    np.testing.assert_allclose(result.as_numpy("C"), 2 * a)
    assert "TensorrtExecutionProvider" in server.log()
