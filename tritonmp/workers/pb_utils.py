"""Triton's `triton_python_backend_utils` API, for model.py files written for Triton.

The worker registers this module under the name `triton_python_backend_utils`, so that
`import triton_python_backend_utils as pb_utils` in an unchanged model.py finds it.
"""

from __future__ import annotations

import enum
import json
import queue
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from tritonmp import datatypes
from tritonmp.ipc.arena import Arena

from . import pb_metrics
from .pb_metrics import Metric, MetricFamily, MetricKind  # noqa: F401 - Triton's names

COUNTER, GAUGE, HISTOGRAM = MetricKind.COUNTER, MetricKind.GAUGE, MetricKind.HISTOGRAM

TRITONSERVER_REQUEST_FLAG_SEQUENCE_START = 1
TRITONSERVER_REQUEST_FLAG_SEQUENCE_END = 2
TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1
TRITONSERVER_REQUEST_RELEASE_ALL = 1
TRITONSERVER_REQUEST_RELEASE_RESCHEDULE = 2

# Set by the worker: sends a BLS request to the frontend and returns its InferenceResponse.
_bls_executor: Callable[..., Any] | None = None
# Set by the python backend: true from the end of the model's initialize() to the start of its
# finalize(), the only time Triton lets a model make BLS requests.
_bls_allowed = False
# Set by the worker: control(op, model, version, **args) -> bool, answered by the frontend.
_control_executor: Callable[..., bool] | None = None
# Set by the python backend: the model's version directory (get_model_dir)
_model_dir = ""

TRITON_STRING_TO_NUMPY = {
    datatypes.to_config(name): (np.bool_ if name == "BOOL" else dt.type) for name, dt in datatypes.NUMPY_OF.items()
}


def triton_string_to_numpy(triton_type_string: str):
    return TRITON_STRING_TO_NUMPY[triton_type_string]


def triton_to_numpy_type(data_type: int):
    return datatypes.NUMPY_OF[datatypes.NAME_OF_ENUM[data_type]].type


def numpy_to_triton_type(data_type) -> int | None:
    try:
        return datatypes.ENUM_OF[datatypes.of_numpy(np.dtype(data_type))]
    except (TypeError, ValueError):
        return None


def serialize_byte_tensor(input_tensor: np.ndarray) -> np.ndarray | None:
    if input_tensor.size == 0:
        return None
    return np.frombuffer(datatypes.serialize_bytes(input_tensor), dtype=np.uint8)


def deserialize_bytes_tensor(encoded_tensor) -> np.ndarray:
    return datatypes.deserialize_bytes(encoded_tensor)


class TritonError(Exception):
    UNKNOWN = 0
    INTERNAL = 1
    NOT_FOUND = 2
    INVALID_ARG = 3
    UNAVAILABLE = 4
    UNSUPPORTED = 5
    ALREADY_EXISTS = 6
    CANCELLED = 7

    _STATUS = {0: "UNKNOWN", 1: "INTERNAL", 2: "NOT_FOUND", 3: "INVALID_ARG", 4: "UNAVAILABLE",
               5: "UNSUPPORTED", 6: "ALREADY_EXISTS", 7: "CANCELLED"}

    def __init__(self, message: str, code: int = 1):
        super().__init__(message)
        self._message = message
        self._code = code

    def message(self) -> str:
        return self._message

    def code(self) -> int:
        return self._code

    def status_name(self) -> str:
        return self._STATUS.get(self._code, "INTERNAL")


def _require(value, types, where: str, what: str) -> None:
    """A TypeError, as Triton's bindings raise one, for an argument of a type they do not take."""
    if not isinstance(value, types) or (isinstance(value, bool) and types is int):
        names = " or ".join(t.__name__ for t in (types if isinstance(types, tuple) else (types,)))
        raise TypeError(f"{where}(): incompatible arguments: {what} must be {names}, got {type(value).__name__}")


def _tensors(values, where: str, what: str) -> list:
    """A list of Tensors: a TypeError for no list (None), TritonModelException for a None in it, as
    Triton's."""
    _require(values, (list, tuple), where, what)
    for value in values:
        if value is None:
            raise TritonModelException(f"{where}: {what} holds None where a pb_utils.Tensor must be")
        _require(value, Tensor, where, f"{what}[]")
    return list(values)


class TritonModelException(Exception):
    pass


pb_metrics._ModelError = TritonModelException


class MemoryType(enum.IntEnum):
    """Where a BLS request prefers its outputs (PreferredMemory)."""

    TRITONSERVER_MEMORY_GPU = 0
    TRITONSERVER_MEMORY_CPU = 1


TRITONSERVER_MEMORY_GPU = MemoryType.TRITONSERVER_MEMORY_GPU
TRITONSERVER_MEMORY_CPU = MemoryType.TRITONSERVER_MEMORY_CPU


class PreferredMemory:
    """A BLS request's preference for the memory of its outputs: TRITONSERVER_MEMORY_GPU puts them
    in the memory of GPU preferred_device_id (as torch tensors behind pb_utils.Tensor) where torch
    sees a GPU, and leaves them in CPU memory otherwise, as Triton does when it cannot."""

    def __init__(self, preferred_memory_type: MemoryType, preferred_device_id: int = 0):
        self.preferred_memory_type = MemoryType(preferred_memory_type)
        self.preferred_device_id = int(preferred_device_id)


class InferenceTrace:
    """The trace of a request, handed on to the BLS requests made for it (their spans are then its
    children). get_context() is its OpenTelemetry context, a JSON object of the W3C `traceparent` (and
    `tracestate`) for a propagator's extract(), so that the model's own spans join the trace; None
    where the request is not traced as OpenTelemetry spans."""

    def __init__(self, context: str | None = None):
        self._context = context

    def get_context(self) -> str | None:
        return self._context or None


_CPU_MEMORY = PreferredMemory(TRITONSERVER_MEMORY_CPU)  # what a request prefers unless told otherwise
_NO_TRACE = InferenceTrace()


class SharedMemory:
    """The worker's shared memory for outputs: free_memory() is how many bytes it has left."""

    _arena: Arena | None = None  # set by the worker

    def free_memory(self) -> int:
        arena = SharedMemory._arena
        return 0 if arena is None else max(0, arena.size - arena.top)


KDL_CPU, KDL_CUDA = 1, 2  # DLPack device types


class Tensor:
    """A named tensor: a numpy array in CPU memory, or (from_dlpack of a GPU tensor, or a BLS output
    with a GPU PreferredMemory) a torch tensor in GPU memory, as Triton's python backend holds them."""

    # fixed attributes, as on Triton's own (C++) objects, which take weak references too
    __slots__ = ("_name", "_array", "_device", "_datatype", "__weakref__")
    _array: np.ndarray  # read only where _device is None (a tensor in GPU memory holds None here)

    def __init__(self, name: str, tensor, datatype: str | None = None):
        _require(name, str, "Tensor", "name")
        if tensor is None:
            raise TypeError("Tensor(): incompatible arguments: the tensor must be an array, got None")
        array = np.asarray(tensor)
        if array.dtype.kind in ("U", "S"):
            array = array.astype(np.object_)
        self._name = name
        self._array = array
        self._device = None  # a torch tensor in GPU memory, for a GPU tensor
        self._datatype = datatype or datatypes.of_numpy(array.dtype)

    @classmethod
    def _received(cls, name: str, array: np.ndarray, datatype: str) -> Tensor:
        """An input as the worker decoded it: already an array of its datatype, so nothing is checked."""
        self = cls.__new__(cls)
        self._name, self._array, self._device, self._datatype = name, array, None, datatype
        return self

    @classmethod
    def _on_gpu(cls, name: str, device_tensor) -> Tensor:
        self = cls.__new__(cls)
        self._name, self._array, self._device = name, None, device_tensor  # type: ignore[assignment]
        self._datatype = datatypes.of_numpy(np.dtype(str(device_tensor.dtype).replace("torch.", "")))
        return self

    def name(self) -> str:
        return self._name

    def as_numpy(self) -> np.ndarray:
        if self._device is not None:
            raise TritonModelException("Tensor is stored in GPU and cannot be converted to NumPy.")
        return self._array

    def _host(self) -> np.ndarray:
        """The values in CPU memory (copied from the GPU for a GPU tensor), to send."""
        return self._array if self._device is None else self._device.cpu().numpy()

    def shape(self) -> list[int]:
        return list(self._array.shape if self._device is None else self._device.shape)

    def triton_dtype(self) -> int:
        return datatypes.ENUM_OF[self._datatype]

    def is_cpu(self) -> bool:
        return self._device is None

    def to_dlpack(self):
        """A DLPack capsule of the tensor, in its memory (shared where it can be)."""
        return self.__dlpack__()

    def __dlpack__(self, stream=None, **options):
        """Exported without a copy; an input held in read-only memory (older DLPack consumers cannot
        be told it is read-only) is exported as a copy."""
        if self._device is not None:
            return self._device.__dlpack__(stream=stream) if stream is not None else self._device.__dlpack__()
        try:
            return self._array.__dlpack__(**options)
        except BufferError:
            return self._array.copy().__dlpack__(**options)

    def __dlpack_device__(self):
        if self._device is not None:
            return self._device.__dlpack_device__()
        return self._array.__dlpack_device__()

    @classmethod
    def from_dlpack(cls, name: str, tensor) -> Tensor:
        """A Tensor over any DLPack producer (an object with __dlpack__, such as a torch tensor) or
        a DLPack capsule, without a copy; GPU memory stays on the GPU (through torch)."""
        if not name or tensor is None:  # as Triton's: the model's mistake, not a wrong type
            raise TritonModelException("Tensor.from_dlpack needs a tensor name and a DLPack tensor or capsule")
        if hasattr(tensor, "__dlpack_device__") and tensor.__dlpack_device__()[0] != KDL_CPU:
            return cls._on_gpu(name, _torch().from_dlpack(tensor))
        if not hasattr(tensor, "__dlpack__"):
            try:
                return cls(name, np.from_dlpack(_Capsule(tensor)))
            except (BufferError, RuntimeError, TypeError):  # a capsule of GPU memory
                torch_tensor = _torch().utils.dlpack.from_dlpack(tensor)
                return cls._on_gpu(name, torch_tensor) if torch_tensor.is_cuda else cls(name, torch_tensor.numpy())
        return cls(name, np.from_dlpack(tensor))

    def _to_gpu(self, device_id: int) -> Tensor:
        """This tensor in the memory of GPU `device_id`, where one is there (else itself)."""
        torch = _torch(required=False)
        if self._device is not None or torch is None or not torch.cuda.is_available() or self._datatype == "BYTES":
            return self
        return Tensor._on_gpu(self._name, torch.from_numpy(np.ascontiguousarray(self._array)).to(f"cuda:{device_id}"))


def _torch(required: bool = True):
    try:
        import torch
    except ImportError:
        if required:
            raise TritonModelException("GPU tensors need torch: pip install 'tritonmp[torch]'") from None
        return None
    return torch


class _Capsule:
    """A bare DLPack capsule as the producer object numpy's from_dlpack takes (CPU memory)."""

    def __init__(self, capsule):
        self.capsule = capsule

    def __dlpack__(self, stream=None, **_):
        return self.capsule

    def __dlpack_device__(self):
        return (1, 0)  # kDLCPU


class InferenceResponse:
    __slots__ = ("_outputs", "_error", "_parameters", "__weakref__")

    def __init__(self, output_tensors=(), error: TritonError | None = None, parameters=None):
        self._outputs = _tensors(output_tensors, "InferenceResponse", "output_tensors")
        self._error = error
        if not parameters:
            self._parameters = {}
            return
        if isinstance(parameters, str):
            parameters = json.loads(parameters)
        for key, value in parameters.items():
            if not isinstance(key, str) or not isinstance(value, (bool, int, str)):
                raise TritonModelException(f"response parameter {key!r}: {value!r} must map a string to a bool, an "
                                           "int or a string")
        self._parameters = dict(parameters)

    def parameters(self) -> str:
        """The response's parameters, as JSON text (they reach the client with the response)."""
        return json.dumps(self._parameters, separators=(",", ":"))

    def output_tensors(self) -> list[Tensor]:
        return self._outputs

    def has_error(self) -> bool:
        return self._error is not None

    def error(self) -> TritonError | None:
        return self._error


class InferenceResponseSender:
    """Sends a request's responses from the model, during `execute` or after it returns (from any
    thread), with Triton's rules: a decoupled model sends any number of responses and then the final
    flag; any other model sends one response, and may send the final flag after it. A send that breaks
    a rule raises TritonModelException and, where the request is still open, ends it with that error,
    so that no client waits for a response that cannot come. A non-decoupled model's one response
    reaches its client when it is sent."""

    __slots__ = ("_send", "_cancelled", "_decoupled", "_lock", "_closed", "_ended", "_sent", "_used", "_executing",
                 "_problem", "__weakref__")

    def __init__(self, send, decoupled: bool = True, cancelled=None):
        if not _orphans.started:
            _orphans.start()
        self._send = send  # send(response | None, final: bool, error: str = "")
        self._cancelled = cancelled  # set when the request's client has gone
        self._decoupled = decoupled
        self._lock = threading.Lock()
        self._closed = False  # the final flag was sent (Triton's "closed" sender)
        self._ended = False  # the client has had its last response or error
        self._sent = 0
        self._used = False  # handed to the model by get_response_sender()
        # while execute() runs, a broken rule only raises: the exception it becomes, if the model lets
        # it out of execute(), answers the batch as Triton answers it; else the rule ends the request
        self._executing = True
        self._problem = ""

    def send(self, response: InferenceResponse | None = None, flags: int = 0) -> None:
        if flags not in (0, TRITONSERVER_RESPONSE_COMPLETE_FINAL):
            raise TritonModelException("Unable to send response. Unsupported flag provided.")
        if flags == 0 and response is None:
            raise TritonModelException("Inference Response object must be provided when the response flags is "
                                       "set to zero.")
        final = flags == TRITONSERVER_RESPONSE_COMPLETE_FINAL
        with self._lock:
            problem = self._check(response, final)
            if problem:
                if self._executing:
                    self._closed, self._problem = True, self._problem or problem
                else:
                    self._end_with(problem)
                raise TritonModelException(problem)
            self._closed = final
            self._sent += 1
            if self._ended:
                return  # a non-decoupled model's final flag after its response
            self._ended = final or not self._decoupled
            self._send(response, self._ended)

    def _check(self, response, final: bool) -> str:
        if not self._decoupled:
            if response is not None and self._sent:
                return "Unable to send response. Non-decoupled model cannot send more than one response."
            if response is None and final and not self._sent:
                return ("Unable to send response. Non-decoupled model cannot send complete final before "
                        "sending a response.")
        if self._closed:
            return "Unable to send response. Response sender has been closed."
        return ""

    def _end_with(self, problem: str) -> None:
        """End the request with the model's mistake, unless it has already ended (lock held)."""
        self._closed = True
        if not self._ended:
            self._ended = True
            self._send(None, True, problem)

    # -- the worker's side -----------------------------------------------------------------
    def _executed(self) -> None:
        """execute() has returned without raising: a rule it broke and caught ends the request now."""
        with self._lock:
            self._executing = False
            if self._problem:
                self._end_with(self._problem)
    def _claim(self) -> str:
        """execute() returned a response for this request: '' when it may answer the request (the
        sender is closed then), else the rule it breaks (and the request ends with that error)."""
        with self._lock:
            problem = self._check(True, True)
            if problem:
                self._end_with(problem)
                return problem
            self._closed = self._ended = True
            self._sent += 1
            return ""

    def _fail(self, problem: str) -> None:
        with self._lock:
            self._end_with(problem)

    def _abort(self) -> None:
        """Nothing more may be sent: the batch failed (its error goes to every open request), or the
        request was rescheduled (its next execution has a sender of its own)."""
        with self._lock:
            self._closed = self._ended = True

    def is_cancelled(self) -> bool:
        """Whether the request's client has gone (or its BLS caller cancelled it)."""
        return self._cancelled is not None and self._cancelled.is_set()

    def __del__(self):
        """A request whose sender is gone before its last response would leave its client waiting: it is
        ended with an error by the orphans' thread, not here (this may run inside another send, holding
        the lock, or inside a garbage collection, holding anything)."""
        if not self._ended:
            _orphans.queue.put(self)


class _Orphans:
    """The thread that ends the requests whose senders were let go before their final response.
    Started with the first sender, in plain code: a finalizer only puts a sender on its queue (a
    SimpleQueue, whose put may be called from a finalizer). Starting a thread from a finalizer, which
    the garbage collector runs wherever it happens to run, waits for the thread to begin, and that
    can wait on a lock the interrupted code holds."""

    def __init__(self):
        self.queue: queue.SimpleQueue = queue.SimpleQueue()
        self.started = False
        self._lock = threading.Lock()

    def start(self) -> None:
        with self._lock:
            if not self.started:
                threading.Thread(target=self._end_each, name="pb-orphaned-senders", daemon=True).start()
                self.started = True

    def _end_each(self) -> None:
        while True:
            sender = self.queue.get()
            sender._fail("the model released this request without sending its final response "
                         "(TRITONSERVER_RESPONSE_COMPLETE_FINAL)")
            del sender


_orphans = _Orphans()


class ResponseIterator:
    """The responses of a decoupled BLS request (`exec(decoupled=True)`), as they arrive; the last one
    carries the final flag and may be empty. Iterating again after the end yields them all again."""

    def __init__(self, responses, cancel):
        self._source = responses  # a generator of InferenceResponse, ending after the final one
        self._cancel = cancel
        self._seen: list[InferenceResponse] = []
        self._index = 0
        self._finished = False

    def __iter__(self) -> ResponseIterator:
        if self._finished:
            self._index = 0
        return self

    def __next__(self) -> InferenceResponse:
        if self._finished:
            if self._index < len(self._seen):
                self._index += 1
                return self._seen[self._index - 1]
            raise StopIteration
        try:
            response = next(self._source)
        except StopIteration:
            self._finished = True
            self._index = len(self._seen)
            raise
        self._seen.append(response)
        return response

    def cancel(self) -> None:
        """Ask the server to cancel the request: the model it runs on sees is_cancelled(), and the
        iterator ends with the responses sent until then (and a CANCELLED error when it was cut short)."""
        if not self._finished:
            self._cancel()


class InferenceRequest:
    """A request handed to execute(); constructed by a model, it is a BLS request."""

    __slots__ = ("_model_name", "_inputs", "_requested", "_id", "_correlation_id", "_flags", "_parameters",
                 "_model_version", "_timeout", "_sender", "_preferred_memory", "_trace", "_release_flags",
                 "__weakref__")

    def __init__(self, request_id: str = "", correlation_id=0, inputs=(), requested_output_names=(),
                 model_name: str = "", model_version: int = -1, flags: int = 0, timeout: int = 0,
                 preferred_memory: PreferredMemory | None = None, trace: InferenceTrace | None = None,
                 parameters=None, **_kwargs):
        # the types Triton's constructor takes (a TypeError otherwise, as from its bindings)
        _require(request_id, str, "InferenceRequest", "request_id")
        _require(correlation_id, (int, str), "InferenceRequest", "correlation_id")
        _require(model_name, str, "InferenceRequest", "model_name")
        for value, what in ((model_version, "model_version"), (flags, "flags"), (timeout, "timeout")):
            _require(value, int, "InferenceRequest", what)
        _require(requested_output_names, (list, tuple), "InferenceRequest", "requested_output_names")
        for output in requested_output_names:
            _require(output, str, "InferenceRequest", "requested_output_names[]")
        self._model_name = model_name
        self._inputs = _tensors(inputs, "InferenceRequest", "inputs")
        self._requested = list(requested_output_names)
        self._id = request_id
        self._correlation_id = correlation_id
        self._flags = flags
        self._parameters = parameters or "{}"  # a dict becomes JSON text when parameters() is first asked
        self._model_version = model_version
        self._timeout = timeout
        self._sender = _kwargs.get("response_sender")
        self._preferred_memory = preferred_memory or _CPU_MEMORY
        self._trace = trace or _NO_TRACE
        self._release_flags = TRITONSERVER_REQUEST_RELEASE_ALL

    @classmethod
    def _received(cls, model_name: str, inputs: list[Tensor], requested: list[str], request_id: str,
                  parameters: dict, sender: InferenceResponseSender, correlation_id, flags: int,
                  trace: str = "") -> InferenceRequest:
        """A request as execute() receives it, from what the worker decoded (already checked)."""
        self = cls.__new__(cls)
        self._model_name, self._inputs, self._requested, self._id = model_name, inputs, requested, request_id
        self._correlation_id, self._flags, self._parameters = correlation_id, flags, parameters
        self._model_version, self._timeout, self._sender = -1, 0, sender
        self._preferred_memory, self._trace = _CPU_MEMORY, InferenceTrace(trace) if trace else _NO_TRACE
        self._release_flags = TRITONSERVER_REQUEST_RELEASE_ALL
        return self

    def trace(self) -> InferenceTrace:
        """The request's trace, to hand to the BLS requests made for it (`trace=request.trace()`)."""
        return self._trace

    def set_flags(self, flags: int) -> None:
        """The sequence flags (TRITONSERVER_REQUEST_FLAG_SEQUENCE_START / _END) of a BLS request."""
        self._flags = flags

    def set_release_flags(self, flags: int) -> None:
        """TRITONSERVER_REQUEST_RELEASE_RESCHEDULE, in execute(), runs the request again in a later
        batch (for models with `sequence_batching { iterative_sequence: true }`); the model returns
        None for it (it sends its responses through its response sender, or returns one when it is
        done)."""
        if flags not in (TRITONSERVER_REQUEST_RELEASE_ALL, TRITONSERVER_REQUEST_RELEASE_RESCHEDULE):
            raise TritonModelException(f"unknown release flags {flags}")
        self._release_flags = flags

    def inputs(self) -> list[Tensor]:
        return self._inputs

    def request_id(self) -> str:
        return self._id

    def correlation_id(self):
        return self._correlation_id

    def flags(self) -> int:
        return self._flags

    def requested_output_names(self) -> list[str]:
        return self._requested

    def parameters(self) -> str:
        parameters = self._parameters
        if not isinstance(parameters, str):
            parameters = self._parameters = json.dumps(parameters, separators=(",", ":"))  # compact, as Triton's
        return parameters

    def timeout(self) -> int:
        return self._timeout

    def is_cancelled(self) -> bool:
        """Whether the request's client has gone (or its BLS caller cancelled it)."""
        return self._sender is not None and self._sender.is_cancelled()

    def get_response_sender(self) -> InferenceResponseSender:
        if self._sender is None:
            raise TritonModelException("get_response_sender() is only available on requests that a model "
                                       "receives in execute()")
        self._sender._used = True
        return self._sender

    def exec(self, decoupled: bool = False):
        """Run this request on a model of the server (BLS) and wait for its response; with
        decoupled=True, a ResponseIterator over every response as it comes."""
        if not _bls_allowed:
            raise TritonModelException("BLS is only supported during the 'execute' function.")
        if _bls_executor is None:
            error = InferenceResponse(error=TritonError("BLS requests can only be made by a model served by tritonmp",
                                                        TritonError.UNAVAILABLE))
            return ResponseIterator(iter([error]), lambda: None) if decoupled else error
        return _bls_executor(self, decoupled)

    async def async_exec(self, decoupled: bool = False):
        """exec() in a thread of the event loop's executor, so that several requests run at once."""
        import asyncio

        return await asyncio.get_running_loop().run_in_executor(None, self.exec, decoupled)

    def model_name(self) -> str:
        return self._model_name

    def model_version(self) -> int:
        return self._model_version


def get_input_tensor_by_name(inference_request: InferenceRequest, name: str) -> Tensor | None:
    for tensor in inference_request.inputs():
        if tensor.name() == name:
            return tensor
    return None


def get_output_tensor_by_name(inference_response: InferenceResponse, name: str) -> Tensor | None:
    for tensor in inference_response.output_tensors():
        if tensor.name() == name:
            return tensor
    return None


def get_input_config_by_name(model_config: dict, name: str) -> dict | None:
    for entry in model_config.get("input", []):
        if entry["name"] == name:
            return entry
    return None


def _control(op: str, model_name: str, model_version: str = "", **args) -> bool:
    if _control_executor is None:
        raise TritonModelException(f"{op}() can only be called from a model served by tritonmp")
    return _control_executor(op, model_name, model_version, **args)


def is_model_ready(model_name: str, model_version: str = "") -> bool:
    """Whether a model (a version, or its highest ready one) of this server is ready."""
    return _control("is_model_ready", model_name, str(model_version))


def load_model(model_name: str, config: str = "", files: dict | None = None) -> None:
    """Load (or reload) a model of the repository, with a config override in JSON and its files
    ({"1/model.py": bytes, ...}) as the repository API takes them; needs explicit model control.
    Raises TritonModelException with the server's reason when the load fails."""
    _control("load_model", model_name, "", config=config, files=dict(files or {}))


def unload_model(model_name: str, unload_dependents: bool = False) -> None:
    """Unload a model of the server; needs explicit model control."""
    _control("unload_model", model_name, "", unload_dependents=unload_dependents)


def get_model_dir() -> str:
    """The directory of the model version this process serves (`<repository>/<model>/<version>`), for a
    python-based backend's model too, whose code lives in the backend directory."""
    return _model_dir


def using_decoupled_model_transaction_policy(model_config: dict) -> bool:
    """Whether the model's configuration (the dict of args["model_config"]) makes it decoupled."""
    return bool(model_config.get("model_transaction_policy", {}).get("decoupled", False))


def get_output_config_by_name(model_config: dict, name: str) -> dict | None:
    for entry in model_config.get("output", []):
        if entry["name"] == name:
            return entry
    return None


class ModelConfig:
    """The model configuration handed to `auto_complete_config`, with Triton's setters."""

    def __init__(self, config: dict):
        self._config = config

    def as_dict(self) -> dict:
        return self._config

    def set_max_batch_size(self, max_batch_size: int) -> None:
        current = self._config.get("max_batch_size", 0)
        if current and current != max_batch_size:
            raise ValueError(f"configuration specified max_batch_size {current}, but auto-complete-config "
                             f"tries to set it to {max_batch_size}")
        self._config["max_batch_size"] = max_batch_size

    def set_dynamic_batching(self) -> None:
        self._config.setdefault("dynamic_batching", {})

    def set_model_transaction_policy(self, policy: dict) -> None:
        self._config["model_transaction_policy"] = dict(policy)

    def _add(self, kind: str, tensor: dict) -> None:
        if not isinstance(tensor, dict) or "name" not in tensor:
            raise ValueError(f"{kind} must be a dict with at least a 'name'")
        entries = self._config.setdefault(kind, [])
        for entry in entries:
            if entry["name"] == tensor["name"]:
                for key, value in tensor.items():
                    if key in entry and entry[key] and entry[key] != value and key != "name":
                        raise ValueError(f"{kind} '{tensor['name']}': configuration has {key} {entry[key]}, "
                                         f"auto-complete-config sets {value}")
                    entry.setdefault(key, value)
                    if not entry[key]:
                        entry[key] = value
                return
        entries.append(dict(tensor))

    def add_input(self, input: dict) -> None:  # noqa: A002 - Triton's parameter name
        self._add("input", input)

    def add_output(self, output: dict) -> None:
        self._add("output", output)


class LogLevel(enum.IntEnum):
    INFO = 0
    WARNING = 1
    ERROR = 2
    VERBOSE = 3


class Logger:
    """Writes to the server's log, which keeps what its settings ask for."""

    LogLevel = LogLevel
    INFO, WARNING, ERROR, VERBOSE = LogLevel.INFO, LogLevel.WARNING, LogLevel.ERROR, LogLevel.VERBOSE

    prefix = "model"
    # Set by the worker: send(level, message) hands a line to the server's log, which keeps or drops
    # it by its log settings as they are when it comes (/v2/logging), as Triton's does.
    _sink: Callable[[str, str], None] | None = None

    @classmethod
    def _write(cls, level: str, message: str) -> None:
        _require(message, str, "Logger", "the message")
        if cls._sink is not None:
            cls._sink(level, message)
            return
        t = time.time()  # outside a worker: stderr, in the server's layout
        stamp = time.strftime("%m%d %H:%M:%S", time.localtime(t)) + f".{int(t % 1 * 1e6):06d}"
        sys.stderr.write(f"{level[0]}{stamp} {cls.prefix}] {message}\n")
        sys.stderr.flush()

    @classmethod
    def log(cls, message: str, level: int = LogLevel.INFO) -> None:
        _require(level, LogLevel, "Logger.log", "the level")  # a pb_utils.Logger level, not a number
        cls._write(LogLevel(level).name, message)

    @classmethod
    def log_info(cls, message: str) -> None:
        cls._write("INFO", message)

    @classmethod
    def log_warn(cls, message: str) -> None:
        cls._write("WARNING", message)

    @classmethod
    def log_error(cls, message: str) -> None:
        cls._write("ERROR", message)

    @classmethod
    def log_verbose(cls, message: str) -> None:
        cls._write("VERBOSE", message)
