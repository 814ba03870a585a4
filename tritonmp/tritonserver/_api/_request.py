"""`InferenceRequest` of the in-process API, and its translation into the server core's request."""

from __future__ import annotations

import asyncio
import queue
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from ... import datatypes, inference
from . import _gpu
from ._errors import InvalidArgumentError, UnsupportedError
from ._handle import ModelHandle
from ._shared import SharedArrays
from ._tensor import DataType, Tensor, parse_device

if TYPE_CHECKING:
    from ...ipc.shm_registry import ShmRef

SEQUENCE_START, SEQUENCE_END = 1, 2  # TRITONSERVER_REQUEST_FLAG_SEQUENCE_*


@dataclass
class InferenceRequest:
    """A request to a model: inputs by name (Tensors, numpy arrays, lists, strings or any DLPack
    producer), parameters, sequence flags and correlation ID, priority, timeout (microseconds), and
    an optional queue (queue.SimpleQueue / queue.Queue, or asyncio.Queue for async_infer) that gets
    every response too."""

    model: ModelHandle
    request_id: str | None = None
    flags: int = 0
    correlation_id: int | str | None = None
    priority: int = 0
    timeout: int = 0
    inputs: dict[str, Tensor | Any] = field(default_factory=dict)
    parameters: dict[str, str | int | bool | float] = field(default_factory=dict)
    output_memory_type: Any = None
    response_queue: queue.SimpleQueue | queue.Queue | asyncio.Queue | None = None

    def _output_device(self) -> int | None:
        """The GPU the outputs are asked for on, or None for host memory."""
        try:
            gpu = parse_device(self.output_memory_type)
        except InvalidArgumentError:
            raise InvalidArgumentError(f"Invalid output memory type: {self.output_memory_type!r}") from None
        if gpu is not None:
            _gpu.runtime()  # refused now, where there is no GPU, not in every response
        return gpu

    def _core_request(self) -> inference.InferRequest:
        if not isinstance(self.parameters, dict):
            raise InvalidArgumentError("parameters must be a dict")
        parameters: dict = {}
        for key, value in self.parameters.items():
            if not isinstance(key, str) or not isinstance(value, (str, int, bool, float)):
                raise InvalidArgumentError(f"Invalid parameter {key!r}: {value!r} (a str, int, bool or float)")
            parameters[key] = value
        if self.correlation_id not in (None, 0, ""):
            parameters["sequence_id"] = self.correlation_id
            parameters["sequence_start"] = bool(self.flags & SEQUENCE_START)
            parameters["sequence_end"] = bool(self.flags & SEQUENCE_END)
        if self.priority:
            parameters["priority"] = self.priority
        if self.timeout:
            parameters["timeout"] = self.timeout
        shared = self.model._server._shared
        for name in self.inputs:
            if not isinstance(name, str):  # as Triton's bindings refuse it, before anything is sent
                raise TypeError(f"InferenceRequest.inputs: an input's name must be a str, got {name!r}")
        inputs = [_core_tensor(name, Tensor._from_object(value), shared) for name, value in self.inputs.items()]
        version = "" if self.model.version in (-1, None) else str(self.model.version)
        return inference.InferRequest(self.model.name, version, self.request_id or "", inputs, None, parameters)


def _core_tensor(name: str, tensor: Tensor, shared: SharedArrays) -> inference.Tensor:
    """An input as the core takes it: where a shared array holds it, the place (the worker reads it
    there); else a view of the caller's array (copied only where it is not contiguous). BYTES are
    serialized into Triton's length-prefixed layout; a GPU tensor is copied to the host first."""
    array = tensor.to_host().host_array
    data: bytes | memoryview | ShmRef
    if tensor.data_type == DataType.BYTES:
        data = datatypes.serialize_bytes(array)
    else:
        if tensor.data_type == DataType.BF16:
            raise UnsupportedError("BF16 tensors are not supported by this server's in-process API yet")
        data = shared.ref(array) or np.ascontiguousarray(array).data.cast("B")
    return inference.Tensor(name, tensor.data_type.name, [int(d) for d in array.shape], data)


def _api_tensor(t: inference.Tensor, gpu: int | None = None) -> Tensor:
    """An output as the API hands it out: a view of the bytes the worker sent (BYTES decoded), or a
    copy of them on GPU `gpu` (BYTES stay in host memory)."""
    data = b"" if t.data is None else t.data
    if t.datatype == "BYTES":
        return Tensor(DataType.BYTES, list(t.shape), datatypes.deserialize_bytes(data).reshape(t.shape))
    tensor = Tensor(DataType[t.datatype], list(t.shape),
                    np.frombuffer(data, dtype=datatypes.NUMPY_OF[t.datatype]).reshape(t.shape))
    return tensor if gpu is None else tensor.to_device(("gpu", gpu))
