"""The TensorRT backend: a serialized engine (`tensorrt_plan`, model.plan) deserialised with the
`tensorrt` Python runtime on this instance's GPU and run on a CUDA stream of its own.

For each batch it picks the first optimization profile whose [min, max] shapes hold every input,
sets the input shapes of the dynamic dimensions, copies the inputs into device buffers (kept and
grown across batches), runs, and copies each output back: straight into a client's system or CUDA
shared-memory region where the request gives one, else to the host for the output arena. Device
memory, streams and copies go through the CUDA runtime's C API (cuda_shm.CudaRuntime), so no
other CUDA binding is needed. A plan built for another GPU or TensorRT version fails the load
with TensorRT's own reason.
"""

from __future__ import annotations

import numpy as np

from tritonmp import datatypes
from tritonmp.ipc.transport import TensorSpec, WorkerSpec

from .backend import Backend, BackendError, WorkRequest, WorkResponse, WorkTensor, check_io, model_path, tensor_dict
from .cuda_shm import CudaRuntime, address


def _import_trt():
    try:
        import tensorrt as trt
    except ImportError:
        raise BackendError("the tensorrt backend needs the 'tensorrt' package: pip install 'tritonmp[tensorrt]'") \
            from None
    return trt


def _logger(trt):
    """A TensorRT logger that keeps the errors, to say why a load failed."""

    class Collecting(trt.ILogger):  # type: ignore[name-defined]  # tensorrt is imported at run time
        def __init__(self):
            trt.ILogger.__init__(self)
            self.errors: list[str] = []

        def log(self, severity, msg):
            if severity in (trt.ILogger.Severity.ERROR, trt.ILogger.Severity.INTERNAL_ERROR):
                self.errors.append(msg)

    return Collecting()


def _engine(trt, path: str):
    logger = _logger(trt)
    runtime = trt.Runtime(logger)
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise BackendError(f"cannot read the TensorRT plan: {e}") from None
    engine = runtime.deserialize_cuda_engine(data)
    if engine is None:
        reason = "; ".join(logger.errors) or "the plan is not a TensorRT engine"
        raise BackendError(f"TensorRT cannot deserialize the plan (TensorRT {trt.__version__}): {reason}")
    return runtime, engine, logger


def _datatype(trt, dtype) -> str:
    try:
        numpy_type = np.dtype(trt.nptype(dtype))
    except (TypeError, ValueError, KeyError):
        return "BF16" if str(dtype).endswith("BF16") else "INVALID"
    return datatypes.of_numpy(numpy_type)


def _io(trt, engine) -> tuple[list[dict], list[dict], int]:
    """Inputs, outputs, and the largest batch every profile's max shape allows (0: not batchable)."""
    inputs: list[dict] = []
    outputs: list[dict] = []
    names = [engine.get_tensor_name(i) for i in range(engine.num_io_tensors)]
    for name in names:
        entry = tensor_dict(name, _datatype(trt, engine.get_tensor_dtype(name)), list(engine.get_tensor_shape(name)))
        (inputs if engine.get_tensor_mode(name) == trt.TensorIOMode.INPUT else outputs).append(entry)
    max_batch = 0
    if all(t["shape"] and t["shape"][0] == -1 for t in inputs + outputs):
        limits = []
        for profile in range(engine.num_optimization_profiles):
            for t in inputs:
                _, _, most = engine.get_tensor_profile_shape(t["name"], profile)
                limits.append(int(most[0]))
        max_batch = min(limits) if limits else 0
    return inputs, outputs, max_batch


def describe(path: str, config: dict) -> tuple[list[dict], list[dict]] | tuple[list[dict], list[dict], int]:
    """The engine's inputs and outputs and its largest batch (for max_batch_size)."""
    trt = _import_trt()
    _, engine, _ = _engine(trt, path)
    return _io(trt, engine)


class _Buffer:
    """A device buffer that grows to the largest tensor it has held."""

    def __init__(self, cuda: CudaRuntime):
        self.cuda, self.ptr, self.nbytes = cuda, 0, 0

    def hold(self, nbytes: int) -> int:
        if nbytes > self.nbytes:
            if self.ptr:
                self.cuda.free(self.ptr)
            self.ptr, self.nbytes = self.cuda.malloc(nbytes), nbytes
        return self.ptr

    def release(self) -> None:
        if self.ptr:
            self.cuda.free(self.ptr)
        self.ptr = self.nbytes = 0


class TensorRTBackend(Backend):
    writes_device_outputs = True  # it is handed client CUDA regions to copy its outputs into

    def __init__(self, spec: WorkerSpec, config: dict):
        if spec.kind != "GPU":
            raise BackendError("a TensorRT engine runs on a GPU: give the model a KIND_GPU instance group "
                               "(or KIND_AUTO on a host with a GPU)")
        trt = _import_trt()
        self.cuda = CudaRuntime()  # sets device 0, the one GPU CUDA_VISIBLE_DEVICES leaves this instance
        self.runtime, self.engine, self.logger = _engine(trt, model_path(spec, config))
        inputs, outputs, max_batch = _io(trt, self.engine)
        check_io(config, inputs, outputs)
        wanted = int(config.get("max_batch_size", 0))
        if wanted > 0 and wanted > max_batch:
            raise BackendError(f"max_batch_size {wanted} is more than the engine's optimization profiles allow "
                               f"({max_batch}); lower max_batch_size or rebuild the engine")
        self.context = self.engine.create_execution_context()
        if self.context is None:
            raise BackendError("TensorRT cannot create an execution context: " + "; ".join(self.logger.errors))
        self.stream = self.cuda.stream()
        self.profile = 0
        self.inputs = [t["name"] for t in inputs]
        self.outputs = [t["name"] for t in outputs]
        self.dtypes = {t["name"]: np.dtype(trt.nptype(self.engine.get_tensor_dtype(t["name"])))
                       for t in inputs + outputs if t["datatype"] not in ("INVALID", "BF16")}
        self.buffers = {name: _Buffer(self.cuda) for name in self.inputs + self.outputs}
        self.detail = (f"tensorrt {trt.__version__} on GPU {spec.device_id}; "
                       f"{self.engine.num_optimization_profiles} optimization profile(s)")

    def metadata(self) -> tuple[list[TensorSpec], list[TensorSpec]]:
        return [], []

    def _pick_profile(self, shapes: dict[str, tuple]) -> int:
        for profile in range(self.engine.num_optimization_profiles):
            fits = True
            for name, shape in shapes.items():
                least, _, most = self.engine.get_tensor_profile_shape(name, profile)
                if len(least) != len(shape) or any(s < lo or s > hi for s, lo, hi in zip(shape, least, most)):
                    fits = False
                    break
            if fits:
                return profile
        raise BackendError("no optimization profile of the engine takes input shapes "
                           + ", ".join(f"{n} {list(s)}" for n, s in shapes.items()))

    def execute(self, requests: list[WorkRequest]) -> list[WorkResponse]:
        (request,) = requests  # the frontend merges a batch into one request for this backend
        context, cuda = self.context, self.cuda
        given = {t.name: t for t in request.inputs}
        arrays = {}
        for name in self.inputs:
            t = given.get(name)
            if t is None:
                raise BackendError(f"input '{name}' is missing")
            if name not in self.dtypes:
                raise BackendError(f"input '{name}' has a type this server cannot hand TensorRT")
            arrays[name] = np.ascontiguousarray(t.array, dtype=self.dtypes[name])
        if self.engine.num_optimization_profiles > 1:
            profile = self._pick_profile({n: a.shape for n, a in arrays.items()})
            if profile != self.profile:
                context.set_optimization_profile_async(profile, self.stream)
                self.profile = profile
        for name, array in arrays.items():
            if not context.set_input_shape(name, array.shape):
                raise BackendError(f"TensorRT refuses shape {list(array.shape)} for input '{name}': "
                                   + "; ".join(self.logger.errors[-1:]))
            ptr = self.buffers[name].hold(array.nbytes)
            cuda.copy_async(ptr, array.ctypes.data, array.nbytes, self.stream)
            context.set_tensor_address(name, ptr)
        results = {}
        for name in self.outputs:
            shape = tuple(context.get_tensor_shape(name))
            if any(d < 0 for d in shape):
                raise BackendError(f"TensorRT cannot tell the shape of output '{name}' for these inputs")
            dtype = self.dtypes.get(name)
            if dtype is None:
                raise BackendError(f"output '{name}' has a type this server cannot return")
            nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
            context.set_tensor_address(name, self.buffers[name].hold(nbytes))
            results[name] = (shape, dtype, nbytes)
        del self.logger.errors[:]
        if not context.execute_async_v3(self.stream):
            cuda.synchronize(self.stream)
            raise BackendError("TensorRT failed to run the engine: " + ("; ".join(self.logger.errors) or "no reason"))
        outputs = []
        for name in request.outputs or self.outputs:
            shape, dtype, nbytes = results[name]
            device_dest = request.device_outputs.get(name)
            host_dest = request.output_buffers.get(name)
            if device_dest is not None and device_dest[1] >= nbytes:
                cuda.copy_async(device_dest[0], self.buffers[name].ptr, nbytes, self.stream)
                array, in_place = np.empty(shape, dtype), True  # only its shape and type are read
            elif host_dest is not None and host_dest.nbytes >= nbytes:
                array = np.frombuffer(host_dest, dtype=dtype, count=int(np.prod(shape, dtype=np.int64))).reshape(shape)
                cuda.copy_async(address(host_dest), self.buffers[name].ptr, nbytes, self.stream)
                in_place = True
            else:
                array, in_place = np.empty(shape, dtype), False
                cuda.copy_async(array.ctypes.data, self.buffers[name].ptr, nbytes, self.stream)
            outputs.append(WorkTensor(name, datatypes.of_numpy(dtype), array, in_place=in_place))
        cuda.synchronize(self.stream)
        return [WorkResponse(outputs=outputs)]

    def finalize(self) -> None:
        for buffer in self.buffers.values():
            buffer.release()
        if self.stream:
            self.cuda.destroy_stream(self.stream)
            self.stream = 0
        self.context = self.engine = self.runtime = None
