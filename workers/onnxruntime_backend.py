"""The ONNX Runtime backend: one InferenceSession, CPU or CUDA provider, a merged batch per run."""

from __future__ import annotations

import os

import numpy as np

from tritonmp.transport import TensorSpec, WorkerSpec

from .backend import BackendError, WorkRequest, WorkResponse, WorkTensor

_ORT_TO_TRITON = {
    "tensor(float)": "FP32", "tensor(double)": "FP64", "tensor(float16)": "FP16",
    "tensor(bfloat16)": "BF16", "tensor(int8)": "INT8", "tensor(int16)": "INT16",
    "tensor(int32)": "INT32", "tensor(int64)": "INT64", "tensor(uint8)": "UINT8",
    "tensor(uint16)": "UINT16", "tensor(uint32)": "UINT32", "tensor(uint64)": "UINT64",
    "tensor(bool)": "BOOL", "tensor(string)": "BYTES",
}


def _int_param(config: dict, key: str) -> int:
    value = config.get("parameters", {}).get(key, {}).get("string_value", "")
    return int(value) if value.strip().lstrip("-").isdigit() else 0


class OnnxRuntimeBackend:
    def __init__(self, spec: WorkerSpec, config: dict):
        import onnxruntime as ort

        path = os.path.join(spec.model_dir, str(spec.model_version), config["default_model_filename"])
        options = ort.SessionOptions()
        intra = _int_param(config, "intra_op_thread_count")
        inter = _int_param(config, "inter_op_thread_count")
        if intra > 0:
            options.intra_op_num_threads = intra
        if inter > 0:
            options.inter_op_num_threads = inter
        providers = ["CPUExecutionProvider"]
        if spec.kind == "GPU":
            if "CUDAExecutionProvider" not in ort.get_available_providers():
                raise BackendError(
                    "instance kind KIND_GPU needs onnxruntime's CUDAExecutionProvider, which this "
                    "onnxruntime build lacks; install tritonmp[gpu] (onnxruntime-gpu)")
            # CUDA_VISIBLE_DEVICES holds only this instance's GPU, so it is device 0 here.
            providers = [("CUDAExecutionProvider", {"device_id": 0}), "CPUExecutionProvider"]
        self.session = ort.InferenceSession(path, sess_options=options, providers=providers)
        self.output_names = [o.name for o in self.session.get_outputs()]
        self.detail = "onnxruntime providers: " + ", ".join(self.session.get_providers())

    def metadata(self) -> tuple[list[TensorSpec], list[TensorSpec]]:
        def spec_of(v):
            shape = [d if isinstance(d, int) else -1 for d in (v.shape or [])]
            return TensorSpec(v.name, _ORT_TO_TRITON.get(v.type, "INVALID"), shape)

        return ([spec_of(v) for v in self.session.get_inputs()],
                [spec_of(v) for v in self.session.get_outputs()])

    def execute(self, requests: list[WorkRequest]) -> list[WorkResponse]:
        (request,) = requests  # the frontend merges a batch into one request for this backend
        feeds = {}
        for t in request.inputs:
            array = t.array
            if t.datatype == "BYTES":  # onnxruntime takes strings, Triton carries bytes
                array = np.array([b.decode("utf-8", "replace") for b in array.reshape(-1)],
                                 dtype=np.object_).reshape(array.shape)
            feeds[t.name] = array
        names = request.outputs or self.output_names
        try:
            values = self.session.run(names, feeds)
        except Exception as e:  # onnxruntime raises its own exception types
            raise BackendError(f"onnxruntime failed: {e}") from None
        outputs = []
        for name, value in zip(names, values):
            value = np.asarray(value)
            if value.dtype.kind == "U":
                value = value.astype(np.object_)
            datatype = "BYTES" if value.dtype == np.object_ else None
            outputs.append(WorkTensor(name, datatype or _numpy_name(value), value))
        return [WorkResponse(outputs=outputs)]

    def finalize(self) -> None:
        self.session = None


def _numpy_name(value: np.ndarray) -> str:
    from tritonmp import datatypes

    return datatypes.of_numpy(value.dtype)
