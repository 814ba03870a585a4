"""The ONNX Runtime backend: one InferenceSession, a merged batch per run. Providers: CPU; CUDA
for KIND_GPU instances; and Triton's execution accelerators, onnxruntime's TensorRT provider
(`gpu_execution_accelerator: [{ name: "tensorrt" }]`) and its OpenVINO provider
(`cpu_execution_accelerator: [{ name: "openvino" }]`)."""

from __future__ import annotations

import os
from typing import cast

import numpy as np

from tritonmp.ipc.transport import TensorSpec, WorkerSpec

from .backend import Backend, BackendError, WorkRequest, WorkResponse, WorkTensor

_ORT_TO_TRITON = {
    "tensor(float)": "FP32", "tensor(double)": "FP64", "tensor(float16)": "FP16",
    "tensor(bfloat16)": "BF16", "tensor(int8)": "INT8", "tensor(int16)": "INT16",
    "tensor(int32)": "INT32", "tensor(int64)": "INT64", "tensor(uint8)": "UINT8",
    "tensor(uint16)": "UINT16", "tensor(uint32)": "UINT32", "tensor(uint64)": "UINT64",
    "tensor(bool)": "BOOL", "tensor(string)": "BYTES",
}


_NUMPY_OF_ORT: dict[str, np.dtype] = {
    "tensor(float)": np.dtype(np.float32), "tensor(double)": np.dtype(np.float64),
    "tensor(float16)": np.dtype(np.float16), "tensor(int8)": np.dtype(np.int8), "tensor(int16)": np.dtype(np.int16),
    "tensor(int32)": np.dtype(np.int32), "tensor(int64)": np.dtype(np.int64), "tensor(uint8)": np.dtype(np.uint8),
    "tensor(uint16)": np.dtype(np.uint16), "tensor(uint32)": np.dtype(np.uint32),
    "tensor(uint64)": np.dtype(np.uint64), "tensor(bool)": np.dtype(np.bool_),
}


def _int_param(config: dict, key: str) -> int:
    value = config.get("parameters", {}).get(key, {}).get("string_value", "")
    return int(value) if value.strip().lstrip("-").isdigit() else 0


SPINNING = "session.intra_op.allow_spinning"


def session_config_entries(config: dict) -> dict[str, str]:
    """onnxruntime session config entries from the model's `session.*` parameters. Intra-op threads
    do not spin-wait between runs unless the model asks for it (`session.intra_op.allow_spinning`:
    "1"): each instance is a process of its own, and threads spinning in one take the cores the
    frontend and the other instances need."""
    entries = {SPINNING: "0"}
    for key, value in config.get("parameters", {}).items():
        if key.startswith("session."):
            entries[key] = str(value.get("string_value", ""))
    return entries


# Triton's execution accelerator names -> (onnxruntime provider, the package that provides it)
GPU_ACCELERATORS = {"tensorrt": ("TensorrtExecutionProvider", "onnxruntime-gpu (with TensorRT's libraries)"),
                    "cuda": ("CUDAExecutionProvider", "onnxruntime-gpu: pip install 'tritonmp[gpu]'")}
CPU_ACCELERATORS = {"openvino": ("OpenVINOExecutionProvider", "onnxruntime-openvino")}
# Triton's TensorRT accelerator parameters that onnxruntime names otherwise
_TRT_RENAMED = {"max_workspace_size_bytes": "trt_max_workspace_size", "max_cached_engines": None}


def _tensorrt_options(params: dict) -> dict:
    options = {"device_id": 0}
    for key, value in params.items():
        if key == "precision_mode":
            mode = value.upper()
            if mode not in ("FP32", "FP16", "INT8"):
                raise BackendError(f"unsupported precision mode '{value}' for the tensorrt accelerator; "
                                   "use FP32, FP16 or INT8")
            if mode == "FP16":
                options["trt_fp16_enable"] = True
            elif mode == "INT8":
                options["trt_fp16_enable"] = options["trt_int8_enable"] = True
        elif key in _TRT_RENAMED:
            renamed = _TRT_RENAMED[key]
            if renamed:
                options[renamed] = value
        elif key.startswith("trt_"):
            options[key] = value
        else:
            raise BackendError(f"unknown parameter '{key}' of the tensorrt accelerator")
    return options


def execution_providers(config: dict, kind: str, available: list[str]) -> list:
    """onnxruntime providers for an instance of `kind`, from the model's execution accelerators
    (Triton's `optimization { execution_accelerators { ... } }`): GPU accelerators for KIND_GPU
    instances, CPU accelerators for KIND_CPU ones, CUDA then CPU otherwise. A provider this
    onnxruntime lacks fails the load, naming the package that has it: never a quiet fallback."""
    accelerators = config.get("optimization", {}).get("execution_accelerators", {})
    chosen = []
    key, table = ("gpu_execution_accelerator", GPU_ACCELERATORS) if kind == "GPU" else \
        ("cpu_execution_accelerator", CPU_ACCELERATORS)
    for accelerator in accelerators.get(key, []):
        name = accelerator.get("name", "")
        if name not in table:
            raise BackendError(f"unknown {key.split('_')[0].upper()} execution accelerator '{name}' for "
                               f"onnxruntime (known: {', '.join(table)})")
        provider, package = table[name]
        if provider not in available:
            raise BackendError(f"execution accelerator '{name}' needs onnxruntime's {provider}, which this "
                               f"onnxruntime build lacks; it comes with {package}")
        params = dict(accelerator.get("parameters", {}))
        if name == "tensorrt":
            chosen.append((provider, _tensorrt_options(params)))
        elif name == "cuda":
            chosen.append((provider, {"device_id": 0, **params}))
        else:
            chosen.append((provider, params))
    if kind == "GPU" and not any(p[0] == "CUDAExecutionProvider" for p in chosen):
        if "CUDAExecutionProvider" not in available:
            raise BackendError("instance kind KIND_GPU needs onnxruntime's CUDAExecutionProvider, which this "
                               "onnxruntime build lacks; install tritonmp[gpu] (onnxruntime-gpu)")
        # CUDA_VISIBLE_DEVICES holds only this instance's GPU, so it is device 0 here.
        chosen.append(("CUDAExecutionProvider", {"device_id": 0}))
    return chosen + ["CPUExecutionProvider"]


class OnnxRuntimeBackend(Backend):
    writes_arena_outputs = True  # outputs of known shapes go straight into the batch's output arena

    def __init__(self, spec: WorkerSpec, config: dict):
        import onnxruntime as ort

        self.batches = int(config.get("max_batch_size", 0) or 0) > 0  # the first dimension is the batch

        path = os.path.join(spec.model_dir, str(spec.model_version), config["default_model_filename"])
        options = ort.SessionOptions()
        intra = _int_param(config, "intra_op_thread_count")
        inter = _int_param(config, "inter_op_thread_count")
        if intra > 0:
            options.intra_op_num_threads = intra
        if inter > 0:
            options.inter_op_num_threads = inter
        entries = session_config_entries(config)
        for key, value in entries.items():
            options.add_session_config_entry(key, value)
        providers = execution_providers(config, spec.kind, ort.get_available_providers())
        try:
            self.session = ort.InferenceSession(path, sess_options=options, providers=providers)
        except Exception as e:  # onnxruntime raises its own exception types
            raise BackendError(f"onnxruntime cannot create the session: {e}") from None
        chosen = [p if isinstance(p, str) else p[0] for p in providers]
        missing = [p for p in chosen if p not in self.session.get_providers()]
        if missing:  # onnxruntime falls back quietly when a provider fails to start: we do not
            raise BackendError(f"onnxruntime could not start {', '.join(missing)} for this model (it would have "
                               "fallen back to the CPU); see the log above for onnxruntime's reason")
        self.output_names = [o.name for o in self.session.get_outputs()]
        self.output_meta = {o.name: o for o in self.session.get_outputs()}
        self.detail = ("onnxruntime providers: " + ", ".join(self.session.get_providers())
                       + "; intra-op threads spin " + ("on" if entries[SPINNING] == "1" else "off"))

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
        if request.output_buffers or request.arena_alloc is not None:
            try:
                placed = self._run_in_place(names, feeds, request.output_buffers, request.arena_alloc)
            except BackendError:
                if request.output_buffers:
                    raise
                placed = None  # an output's shape was not what its declaration implied: run it plainly
            if placed is not None:
                return [WorkResponse(outputs=placed)]
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

    def _run_in_place(self, names: list[str], feeds: dict, buffers: dict, arena_alloc) -> list[WorkTensor] | None:
        """Run with onnxruntime writing outputs straight into the client's shared memory, or else into
        the batch's output arena, where their shapes are known before the run; None when that is not
        possible here."""
        batch = next((a.shape[0] for a in feeds.values() if getattr(a, "ndim", 0)), None)
        binding = self.session.io_binding()
        for name, array in feeds.items():
            if not isinstance(array, np.ndarray) or array.dtype == np.object_:
                return None
            binding.bind_cpu_input(name, np.ascontiguousarray(array))
        targets = {}
        for name in names:
            meta = self.output_meta[name]
            buffer = buffers.get(name)
            dtype = _NUMPY_OF_ORT.get(meta.type)
            shape: list[int | None] = [d if isinstance(d, int) else None for d in (meta.shape or [])]
            if shape and shape[0] is None and batch is not None and self.batches:
                shape[0] = batch
            if dtype is None or None in shape:
                binding.bind_output(name, "cpu")
                continue
            dims = cast("list[int]", shape)  # every dimension known, as just checked
            count = int(np.prod(dims, dtype=np.int64))
            nbytes = count * dtype.itemsize
            offset = -1
            if buffer is None:
                room = arena_alloc(nbytes) if arena_alloc is not None else None
                if room is None:
                    binding.bind_output(name, "cpu")
                    continue
                buffer, offset = room
            elif nbytes > buffer.nbytes:
                return None  # the frontend's size check reports it, on the ordinary path
            target = np.frombuffer(buffer, dtype=dtype, count=count).reshape(dims)
            binding.bind_output(name, "cpu", 0, dtype, dims, target.ctypes.data)
            targets[name] = (target, offset)
        if not targets:
            return None
        try:
            self.session.run_with_iobinding(binding)
        except Exception as e:
            raise BackendError(f"onnxruntime failed: {e}") from None
        outputs = []
        for name, value in zip(names, binding.get_outputs()):
            if name in targets:
                target, offset = targets[name]
                outputs.append(WorkTensor(name, _numpy_name(target), target, in_place=offset < 0, arena_offset=offset))
            else:
                array = value.numpy()
                outputs.append(WorkTensor(name, _numpy_name(array), array))
        return outputs

    def finalize(self) -> None:
        self.session = None


def _numpy_name(value: np.ndarray) -> str:
    from tritonmp import datatypes

    return datatypes.of_numpy(value.dtype)
