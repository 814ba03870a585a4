"""The OpenVINO backend: an OpenVINO IR (model.xml beside its model.bin), or any file OpenVINO
reads as a model (an ONNX file given as default_model_filename), compiled for the CPU.

Triton's openvino backend parameters are read from config.pbtxt: NUM_STREAMS, PERFORMANCE_HINT,
INFERENCE_NUM_THREADS, COMPILATION_NUM_THREADS, HINT_BF16, CPU_EXTENSION_PATH, TARGET_DEVICE
(CPU), RESHAPE_IO_LAYERS, SKIP_OV_DYNAMIC_BATCHSIZE and ENABLE_BATCH_PADDING. Any other
parameter is a load error that names it. With max_batch_size > 0 the first dimension of every
input is the batch: it is made dynamic, so any batch up to max_batch_size runs, unless
SKIP_OV_DYNAMIC_BATCHSIZE fixes it at max_batch_size (then smaller batches fail, or are padded
with ENABLE_BATCH_PADDING and the padding dropped from the outputs).
"""

from __future__ import annotations

import numpy as np

from tritonmp import datatypes
from tritonmp.ipc.transport import TensorSpec, WorkerSpec

from .backend import (
    Backend,
    BackendError,
    WorkRequest,
    WorkResponse,
    WorkTensor,
    check_io,
    model_path,
    param,
    tensor_dict,
)

# parameters that mean something to every backend of this server
GENERAL_PARAMETERS = {"execution_timeout_secs"}
# Triton's openvino backend parameters that become compile-time properties of the device
DEVICE_PARAMETERS = ("INFERENCE_NUM_THREADS", "COMPILATION_NUM_THREADS", "HINT_BF16", "NUM_STREAMS",
                     "PERFORMANCE_HINT")
MODEL_PARAMETERS = ("CPU_EXTENSION_PATH", "SKIP_OV_DYNAMIC_BATCHSIZE", "ENABLE_BATCH_PADDING",
                    "RESHAPE_IO_LAYERS", "TARGET_DEVICE")


def _yes(config: dict, key: str) -> bool:
    return param(config, key).strip().lower() == "yes"


def device_properties(config: dict) -> dict[str, str]:
    """compile_model properties from the model's parameters, checked as Triton's backend checks
    them; BackendError naming the parameter when one is unknown or has a value it cannot take."""
    unknown = sorted(set(config.get("parameters", {})) - set(DEVICE_PARAMETERS) - set(MODEL_PARAMETERS)
                     - GENERAL_PARAMETERS)
    if unknown:
        raise BackendError("unknown openvino backend parameter(s) " + ", ".join(f"'{k}'" for k in unknown)
                           + "; known: " + ", ".join(DEVICE_PARAMETERS + MODEL_PARAMETERS))
    props = {}
    for key in DEVICE_PARAMETERS:
        value = param(config, key).strip().lower()
        if not value:
            continue
        if key in ("INFERENCE_NUM_THREADS", "COMPILATION_NUM_THREADS"):
            if not value.isdigit():
                raise BackendError(f"expected the parameter '{key}' to be a non-negative number, got {value}")
            props[key] = value
        elif key == "HINT_BF16":
            if value != "yes":
                raise BackendError(f"expected the parameter '{key}' to be YES, got {value}")
            props["INFERENCE_PRECISION_HINT"] = "bf16"
        elif key == "NUM_STREAMS":
            if value not in ("auto", "numa") and not value.isdigit():
                raise BackendError(f"expected the parameter '{key}' to be either AUTO/NUMA/<int_value>, got {value}")
            props[key] = value.upper() if not value.isdigit() else value
        elif key == "PERFORMANCE_HINT":
            if value not in ("latency", "throughput", "cumulative_throughput"):
                raise BackendError(f"expected the parameter '{key}' to be LATENCY/THROUGHPUT/CUMULATIVE_THROUGHPUT, "
                                   f"got {value}")
            props[key] = value.upper()
    device = param(config, "TARGET_DEVICE").strip().upper() or "CPU"
    if device != "CPU":
        raise BackendError(f"TARGET_DEVICE '{device}' is not supported here; the openvino backend runs on the CPU")
    return props


def _datatype(element_type) -> str:
    if element_type.get_type_name() == "string":
        return "BYTES"
    try:
        return datatypes.of_numpy(np.dtype(element_type.to_dtype()))
    except (TypeError, ValueError, KeyError):
        return "INVALID"


def _shape(port) -> list[int] | None:
    shape = port.get_partial_shape()
    if shape.rank.is_dynamic:
        return None
    return [d.get_length() if d.is_static else -1 for d in shape]


def _io(model) -> tuple[list[dict], list[dict]]:
    def one(port) -> dict:
        return tensor_dict(port.get_any_name(), _datatype(port.get_element_type()), _shape(port))

    return [one(p) for p in model.inputs], [one(p) for p in model.outputs]


def _read(path: str, config: dict):
    try:
        import openvino as ov
    except ImportError:
        raise BackendError("the openvino backend needs the 'openvino' package: pip install 'tritonmp[openvino]'") \
            from None
    core = ov.Core()
    extension = param(config, "CPU_EXTENSION_PATH").strip()
    if extension:
        try:
            core.add_extension(extension)
        except Exception as e:
            raise BackendError(f"cannot load the CPU extension '{extension}': {e}") from None
    try:
        return ov, core, core.read_model(path)
    except Exception as e:  # openvino raises RuntimeError with its own text
        raise BackendError(f"OpenVINO cannot read the model: {_first_line(e)}") from None


def _first_line(e: Exception) -> str:
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip() and not ln.startswith("Exception from")]
    return lines[0] if lines else type(e).__name__


def describe(path: str, config: dict) -> tuple[list[dict], list[dict]]:
    """The model's inputs and outputs, for auto-complete (no compilation); its parameters are
    checked here too, so that `tritonmp check` reports them."""
    device_properties(config)
    _, _, model = _read(path, config)
    return _io(model)


class OpenVinoBackend(Backend):
    def __init__(self, spec: WorkerSpec, config: dict):
        props = device_properties(config)
        ov, core, model = _read(model_path(spec, config), config)
        self.max_batch_size = int(config.get("max_batch_size", 0))
        reshape_io = _yes(config, "RESHAPE_IO_LAYERS")
        self.fixed_batch = self.max_batch_size > 0 and _yes(config, "SKIP_OV_DYNAMIC_BATCHSIZE")
        self.pad = _yes(config, "ENABLE_BATCH_PADDING")
        inputs, outputs = _io(model)
        check_io(config, inputs, outputs, reshapable=self.max_batch_size > 0, input_dims_free=reshape_io)
        declared = {t["name"]: t for t in config.get("input", [])}
        shapes = {}
        for port in model.inputs:
            name = port.get_any_name()
            shape = port.get_partial_shape()
            if reshape_io:
                dims = [int(d) for d in declared[name].get("dims", [])]
                shape = ov.PartialShape(([-1] if self.max_batch_size else []) + dims)
            if self.max_batch_size > 0 and shape.rank.is_static and len(shape):
                shape[0] = ov.Dimension(self.max_batch_size) if self.fixed_batch else ov.Dimension()
            shapes[name] = shape
        try:
            if shapes:
                model.reshape(shapes)
            self.compiled = core.compile_model(model, "CPU", props)
        except Exception as e:
            raise BackendError(f"OpenVINO cannot compile the model: {_first_line(e)}") from None
        self.request = self.compiled.create_infer_request()
        self.outputs = {p.get_any_name(): p for p in self.compiled.outputs}
        self.input_types = {p.get_any_name(): p.get_element_type() for p in self.compiled.inputs}
        self.detail = (f"openvino {ov.get_version().split('-')[0]} on CPU; streams "
                       f"{self.compiled.get_property('NUM_STREAMS')}, inference threads "
                       f"{self.compiled.get_property('INFERENCE_NUM_THREADS')}")

    def metadata(self) -> tuple[list[TensorSpec], list[TensorSpec]]:
        return [], []

    def execute(self, requests: list[WorkRequest]) -> list[WorkResponse]:
        (request,) = requests  # the frontend merges a batch into one request for this backend
        feeds = {}
        batch = None
        for t in request.inputs:
            array = t.array
            if t.datatype == "BYTES":
                if self.input_types[t.name].get_type_name() != "string":
                    raise BackendError(f"input '{t.name}' is BYTES, which this OpenVINO model does not take")
                array = np.array([bytes(b) for b in array.reshape(-1)], dtype=np.bytes_).reshape(array.shape)
            if self.max_batch_size > 0 and array.ndim:
                batch = array.shape[0]
            feeds[t.name] = array
        pad = 0
        if self.fixed_batch and batch is not None and batch != self.max_batch_size:
            if not self.pad or batch > self.max_batch_size:
                raise BackendError(f"expected requests with batch size '{self.max_batch_size}', got '{batch}'... "
                                   "this error can be avoided by setting 'ENABLE_BATCH_PADDING' parameter in model "
                                   "configuration to 'YES' at a performance cost.")
            pad = self.max_batch_size - batch
            feeds = {name: np.concatenate([a, np.zeros((pad, *a.shape[1:]), a.dtype)]) for name, a in feeds.items()}
        try:
            # share_outputs: the arrays are views of OpenVINO's own output memory, read (into the output
            # arena or the client's region) before the next run
            results = self.request.infer(feeds, share_inputs=True, share_outputs=True)
        except Exception as e:
            raise BackendError(f"OpenVINO failed: {_first_line(e)}") from None
        by_name = {port.get_any_name(): value for port, value in results.items()}
        outputs = []
        for name in request.outputs or self.outputs:
            value = by_name[name]
            if pad:
                value = value[:batch]
            if value.dtype.kind in "SU":
                outputs.append(WorkTensor(name, "BYTES", value.astype(np.object_)))
            else:
                outputs.append(WorkTensor(name, datatypes.of_numpy(value.dtype), value))
        return [WorkResponse(outputs=outputs)]

    def finalize(self) -> None:
        self.request = None
        self.compiled = None
