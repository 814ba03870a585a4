"""Tensors of the in-process API: `Tensor`, `DataType`, `MemoryType`, `DLDeviceType`.

A Tensor holds a numpy array in CPU memory and is a DLPack producer and consumer, as Triton's is.
An input given as a numpy array is used as it is (no copy here: it is written once, into the memory
the model's worker reads); an output is a view of the bytes the worker sent, kept alive for as long
as any Tensor, numpy array or DLPack consumer refers to it.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import datatypes
from ._errors import InvalidArgumentError, UnsupportedError


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


@dataclass
class Tensor:
    """A tensor: data type, shape, and its values in CPU memory (`_array`)."""

    data_type: DataType
    shape: Sequence[int]
    _array: np.ndarray

    @property
    def memory_type(self) -> MemoryType:
        return MemoryType.CPU

    @property
    def memory_type_id(self) -> int:
        return 0

    @property
    def size(self) -> int:
        return int(self._array.nbytes)

    @property
    def data_ptr(self) -> int:
        return int(self._array.ctypes.data)

    def __dlpack__(self, *, stream=None, **_options):
        if self.data_type == DataType.BYTES:
            raise UnsupportedError("DLPack does not support bytes arrays: use to_bytes_array() or to_string_array()")
        try:
            return self._array.__dlpack__()
        except BufferError:  # read-only memory, which older DLPack consumers cannot be told about
            return self._array.copy().__dlpack__()

    def __dlpack_device__(self) -> tuple[DLDeviceType, int]:
        return DLDeviceType.kDLCPU, 0

    def to_bytes_array(self) -> np.ndarray:
        """A BYTES tensor as a numpy array of bytes objects."""
        self._check_bytes()
        return self._array

    def to_string_array(self) -> np.ndarray:
        """A BYTES tensor as a numpy array of str (decoded as UTF-8)."""
        self._check_bytes()
        return np.array([b.decode() if isinstance(b, bytes) else str(b) for b in self._array.flat],
                        dtype=object).reshape(self._array.shape)

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
        """A Tensor over a DLPack producer's memory (CPU memory: a GPU tensor is refused)."""
        if hasattr(obj, "__dlpack_device__") and obj.__dlpack_device__()[0] not in (DLDeviceType.kDLCPU,
                                                                                     DLDeviceType.kDLCUDAHost):
            raise UnsupportedError("this server reads tensors from CPU memory: move the tensor to the host first")
        return Tensor._from_numpy(np.from_dlpack(obj))

    def to_host(self) -> Tensor:
        return self

    def to_device(self, device) -> Tensor:
        if device in ("cpu", MemoryType.CPU, (MemoryType.CPU, 0), (DLDeviceType.kDLCPU, 0)):
            return self
        raise UnsupportedError(f"tensors of this server live in CPU memory; cannot move one to {device!r}")

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
