"""What the backends' descriptions and workers decide without a model running: how messages name
each kind of model, and execution accelerators as onnxruntime providers."""


import pytest


def test_messages_name_each_kind_of_model():
    from tritonmp.backends import model_kind

    pairs = (("onnxruntime", "onnxruntime_onnx"), ("openvino", ""), ("tensorrt", "tensorrt_plan"),
             ("tensorflow", "tensorflow_graphdef"), ("tensorflow", "tensorflow_savedmodel"),
             ("pytorch", "pytorch_libtorch"))
    assert [model_kind(b, p) for b, p in pairs] == ["ONNX model", "OpenVINO model", "TensorRT engine",
                                                    "TensorFlow GraphDef", "TensorFlow SavedModel signature",
                                                    "pytorch model"]


def test_execution_accelerators_become_onnxruntime_providers():
    """Triton's accelerator config as onnxruntime providers, given what an onnxruntime build offers."""
    from tritonmp.workers.backend import BackendError
    from tritonmp.workers.onnxruntime_backend import execution_providers

    gpu_build = ["TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"]
    trt = {"optimization": {"execution_accelerators": {"gpu_execution_accelerator": [
        {"name": "tensorrt", "parameters": {"precision_mode": "FP16", "max_workspace_size_bytes": "1073741824",
                                            "trt_engine_cache_enable": "true"}}]}}}
    assert execution_providers(trt, "GPU", gpu_build) == [
        ("TensorrtExecutionProvider", {"device_id": 0, "trt_fp16_enable": True, "trt_max_workspace_size": "1073741824",
                                       "trt_engine_cache_enable": "true"}),
        ("CUDAExecutionProvider", {"device_id": 0}), "CPUExecutionProvider"]
    assert execution_providers(trt, "CPU", gpu_build) == ["CPUExecutionProvider"]  # GPU accelerators: GPU instances
    ov = {"optimization": {"execution_accelerators": {"cpu_execution_accelerator": [{"name": "openvino"}]}}}
    assert execution_providers(ov, "CPU", ["OpenVINOExecutionProvider", "CPUExecutionProvider"]) == [
        ("OpenVINOExecutionProvider", {}), "CPUExecutionProvider"]
    bad = {"optimization": {"execution_accelerators": {"gpu_execution_accelerator": [
        {"name": "tensorrt", "parameters": {"precision_mode": "FP8"}}]}}}
    with pytest.raises(BackendError, match="unsupported precision mode 'FP8'"):
        execution_providers(bad, "GPU", gpu_build)
    with pytest.raises(BackendError, match="needs onnxruntime's TensorrtExecutionProvider.*onnxruntime-gpu"):
        execution_providers(trt, "GPU", ["CUDAExecutionProvider", "CPUExecutionProvider"])
    with pytest.raises(BackendError, match="KIND_GPU needs onnxruntime's CUDAExecutionProvider"):
        execution_providers({}, "GPU", ["CPUExecutionProvider"])
