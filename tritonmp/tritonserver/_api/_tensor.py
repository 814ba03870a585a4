"""Tensors of the in-process API: `Tensor`, `DataType`, `MemoryType`, `DLDeviceType`.

A Tensor holds a numpy array in CPU memory, or GPU memory, and is a DLPack producer and consumer,
as Triton's is. An input given as a numpy array is used as it is (no copy here: it is written once,
into the memory the model's worker reads); an output is a view of the bytes the worker sent, kept
alive for as long as any Tensor, numpy array or DLPack consumer refers to it.

GPU memory: a GPU DLPack producer's tensor (a torch or CuPy tensor on a GPU) is taken without a copy
and copied to the host when a request uses it (models run in worker processes and read inputs from
host shared memory); an output asked for on a GPU (`output_memory_type`) or moved there with
`to_device` is copied into device memory this process allocates (see _gpu.py).
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ... import datatypes
from . import _dlpack, _gpu
from ._errors import InvalidArgumentError, UnsupportedError

_GPU_DEVICES = (2, 13)  # kDLCUDA, kDLCUDAManaged


class DataType(enum.IntEnum):
    INVALID = 0
    BOOL = 1
    UINT8 = 2
    UINT16 = 3
    UINT32 = 4
    UINT64 = 5
    INT8 = 6
    INT16 = 7
    INT32 = 8
    INT64 = 9
    FP16 = 10
    FP32 = 11
    FP64 = 12
    BYTES = 13
    BF16 = 14


class MemoryType(enum.IntEnum):
    CPU = 0
    CPU_PINNED = 1
    GPU = 2


class DLDeviceType(enum.IntEnum):
    kDLCPU = 1
    kDLCUDA = 2
    kDLCUDAHost = 3


def parse_device(device: Any) -> int | None:
    """Where a device or memory type names (Triton's DeviceOrMemoryType: "cpu", "gpu:1", "cuda",
    MemoryType.GPU, (MemoryType.GPU, 1), (DLDeviceType.kDLCUDA, 0), ...): None for host memory, else
    the GPU's number."""
    kind, number = device if isinstance(device, tuple) and len(device) == 2 else (device, 0)
    if isinstance(kind, str):
        kind, _, index = kind.lower().partition(":")
        if index:
            if isinstance(device, tuple) or not index.isdigit():
                raise InvalidArgumentError(f"Invalid memory type or device: {device!r}")
            number = int(index)
    if not isinstance(number, int) or number < 0:
        raise InvalidArgumentError(f"Invalid memory type or device: {device!r}")
    if kind in (None, "cpu", MemoryType.CPU, MemoryType.CPU_PINNED, DLDeviceType.kDLCPU, DLDeviceType.kDLCUDAHost):
        return None
    if kind in ("gpu", "cuda", MemoryType.GPU, DLDeviceType.kDLCUDA):
        return number
    raise InvalidArgumentError(f"Invalid memory type or device: {device!r}")


@dataclass
class Tensor:
    """A tensor: data type, shape, and its values in CPU memory (`_array`) or in GPU memory
    (`_memory`: a _gpu.DeviceMemory or _gpu.BorrowedMemory, `_array` then None)."""

    data_type: DataType
    shape: Sequence[int]
    _array: np.ndarray | None
    _memory: Any = None
    _serialized: np.ndarray | None = field(default=None, repr=False, compare=False)  # a BYTES tensor's buffer

    @property
    def _buffer(self) -> np.ndarray:
        """The bytes the tensor's data_ptr and size describe: its array, or for BYTES, Triton's
        serialized buffer (each element's 4-byte little-endian length, then its bytes), made once."""
        if self.data_type != DataType.BYTES:
            return self.host_array
        if self._serialized is None:
            self._serialized = np.frombuffer(datatypes.serialize_bytes(self.host_array), dtype=np.uint8)
        return self._serialized

    @property
    def memory_type(self) -> MemoryType:
        return MemoryType.CPU if self._memory is None else MemoryType.GPU

    @property
    def memory_type_id(self) -> int:
        return 0 if self._memory is None else self._memory.device_id

    @property
    def size(self) -> int:
        return int(self._buffer.nbytes if self._memory is None else self._memory.nbytes)

    @property
    def data_ptr(self) -> int:
        return int(self._buffer.ctypes.data if self._memory is None else self._memory.pointer)

    def __dlpack__(self, *, stream=None, **_options):
        if self.data_type == DataType.BYTES:
            raise UnsupportedError("DLPack does not support bytes arrays: use to_bytes_array() or to_string_array()")
        if self._memory is not None:  # copies into it were synchronous: ready on any stream
            return _dlpack.export(self._memory.pointer, (DLDeviceType.kDLCUDA, self._memory.device_id),
                                  tuple(int(d) for d in self.shape), self._numpy_type(), self._memory)
        array = self.host_array
        shape = tuple([int(d) for d in self.shape])  # made at its size: no tuple resized per call
        if (array.flags.writeable and array.flags.c_contiguous and _dlpack.exportable(array.dtype)
                and int(np.prod(shape, dtype=np.int64)) == array.size):
            # the capsule's owner is this Tensor, as in Triton: it lives as long as the consumer's
            # view, and the view takes the Tensor's shape as it is now
            return _dlpack.export(array.ctypes.data, (DLDeviceType.kDLCPU, 0), shape, array.dtype, self)
        try:
            return array.reshape(shape).__dlpack__()
        except BufferError:  # read-only memory, which older DLPack consumers cannot be told about
            return array.reshape(shape).copy().__dlpack__()

    def __dlpack_device__(self) -> tuple[DLDeviceType, int]:
        if self._memory is not None:
            return DLDeviceType.kDLCUDA, self._memory.device_id
        return DLDeviceType.kDLCPU, 0

    @property
    def host_array(self) -> np.ndarray:
        """`_array`, for a tensor in host memory (every BYTES tensor is)."""
        assert self._array is not None, "the tensor is in GPU memory"
        return self._array

    def _numpy_type(self) -> np.dtype:
        return np.dtype(datatypes.NUMPY_OF[self.data_type.name])

    def to_bytes_array(self) -> np.ndarray:
        """A BYTES tensor as a numpy array of bytes objects."""
        self._check_bytes()
        return self.host_array

    def to_string_array(self) -> np.ndarray:
        """A BYTES tensor as a numpy array of str (decoded as UTF-8)."""
        self._check_bytes()
        array = self.host_array
        return np.array([b.decode() if isinstance(b, bytes) else str(b) for b in array.flat],
                        dtype=np.object_).reshape(array.shape)

    def _check_bytes(self) -> None:
        if self.data_type != DataType.BYTES:
            raise InvalidArgumentError(f"Tensor has data type {self.data_type.name} not byte")

    @staticmethod
    def from_string_array(string_array: list[str] | np.ndarray) -> Tensor:
        array = np.asarray(string_array, dtype=object)
        encoded = np.array([s.encode() if isinstance(s, str) else bytes(s) for s in array.flat],
                           dtype=object).reshape(array.shape)
        return Tensor(DataType.BYTES, list(encoded.shape), encoded)

    @staticmethod
    def from_bytes_array(bytes_array: list[bytes] | np.ndarray) -> Tensor:
        array = np.asarray(bytes_array, dtype=object)
        return Tensor(DataType.BYTES, list(array.shape), array)

    @staticmethod
    def from_dlpack(obj: Any) -> Tensor:
        """A Tensor over a DLPack producer's memory, host or GPU, without a copy."""
        device = obj.__dlpack_device__()[0] if hasattr(obj, "__dlpack_device__") else DLDeviceType.kDLCPU
        if device in _GPU_DEVICES:
            try:
                # stream 1: the producer makes the tensor ready on the legacy default stream, which
                # the synchronous copies out of it are ordered after
                borrowed = _dlpack.borrow(obj.__dlpack__(stream=1))
            except ValueError as exc:
                raise InvalidArgumentError(str(exc)) from None
            name = datatypes.of_numpy(borrowed.dtype)
            return Tensor(DataType[name], list(borrowed.shape), None, _gpu.BorrowedMemory(borrowed))
        if device not in (DLDeviceType.kDLCPU, DLDeviceType.kDLCUDAHost):
            raise UnsupportedError(f"DLPack device type {int(device)} is not supported: only host and CUDA memory")
        return Tensor._from_numpy(np.from_dlpack(obj))

    def to_host(self) -> Tensor:
        """This tensor in host memory (itself where it is there already)."""
        if self._memory is None:
            return self
        array = _gpu.to_host(self._memory, tuple(int(d) for d in self.shape), self._numpy_type())
        return Tensor(self.data_type, list(self.shape), array)

    def to_device(self, device) -> Tensor:
        """This tensor on `device` ("cpu", "gpu:1", MemoryType.GPU, (DLDeviceType.kDLCUDA, 0), ...),
        copied there unless it is there already."""
        gpu = parse_device(device)
        if gpu is None:
            return self.to_host()
        if self._memory is not None and self._memory.device_id == gpu:
            return self
        if self.data_type == DataType.BYTES:
            raise UnsupportedError("BYTES tensors stay in host memory")
        memory = _gpu.to_device(self.host_array, gpu) if self._memory is None else \
            _gpu.copy_to_device(self._memory, gpu)
        return Tensor(self.data_type, list(self.shape), None, memory)

    @staticmethod
    def _from_object(obj: Any) -> Tensor:
        """A Tensor from what the API takes as an input: a Tensor, a numpy array or scalar, a list,
        a str, bytes, or any DLPack producer."""
        if isinstance(obj, Tensor):
            return obj
        if isinstance(obj, (np.ndarray, np.generic)):
            return Tensor._from_numpy(np.asarray(obj))
        if hasattr(obj, "__dlpack__"):
            return Tensor.from_dlpack(obj)
        if isinstance(obj, (str, bytes)):
            obj = [obj]
        if isinstance(obj, list):
            return Tensor._from_numpy(np.array(obj, dtype=object if _has_text(obj) else None))
        raise InvalidArgumentError(f"Input type {type(obj)} not supported")

    @staticmethod
    def _from_numpy(array: np.ndarray) -> Tensor:
        if array.dtype.kind in ("U", "S", "O"):
            return Tensor.from_string_array(array) if array.dtype.kind == "U" or _has_text(array.tolist()) \
                else Tensor.from_bytes_array(array)
        try:
            name = datatypes.of_numpy(array.dtype)
        except (KeyError, ValueError, TypeError):
            raise InvalidArgumentError(f"Unsupported numpy type {array.dtype}") from None
        return Tensor(DataType[name], list(array.shape), array)


def _has_text(values) -> bool:
    stack = [values]
    while stack:
        item = stack.pop()
        if isinstance(item, list):
            stack.extend(item)
        elif isinstance(item, str):
            return True
    return False
