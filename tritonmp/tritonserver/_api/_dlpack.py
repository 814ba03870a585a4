"""DLPack capsules read and made with ctypes, for memory numpy cannot take (GPU memory).

`borrow(capsule)` takes a producer's capsule as its consumer: the memory's address, device, shape
and data type, and a `release()` that hands it back (calls the producer's deleter). `export(...)`
makes a capsule over memory this process owns, keeping its owner alive until the consumer calls the
deleter (or, if no consumer ever takes the capsule, until the capsule itself is freed).

The structs are DLPack's stable (unversioned) ABI, which every producer and consumer still speaks:
the capsule is named "dltensor", and "used_dltensor" once a consumer has taken it.
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

CAPSULE_NAME = b"dltensor"
USED_CAPSULE_NAME = b"used_dltensor"
_INT, _UINT, _FLOAT, _BFLOAT, _BOOL = 0, 1, 2, 4, 6  # DLDataTypeCode


class _Device(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _Tensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _Device), ("ndim", ctypes.c_int32),
                ("dtype", _DataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class _ManagedTensor(ctypes.Structure):
    pass


_DELETER = ctypes.CFUNCTYPE(None, ctypes.POINTER(_ManagedTensor))
_ManagedTensor._fields_ = [("dl_tensor", _Tensor), ("manager_ctx", ctypes.c_void_p), ("deleter", _DELETER)]
_CAPSULE_DESTRUCTOR = ctypes.CFUNCTYPE(None, ctypes.c_void_p)

_api = ctypes.pythonapi
_api.PyCapsule_New.restype = ctypes.py_object
_api.PyCapsule_New.argtypes = [ctypes.c_void_p, ctypes.c_char_p, _CAPSULE_DESTRUCTOR]
_api.PyCapsule_GetPointer.restype = ctypes.c_void_p
_api.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
_api.PyCapsule_SetName.restype = ctypes.c_int
_api.PyCapsule_SetName.argtypes = [ctypes.py_object, ctypes.c_char_p]
_api.PyCapsule_IsValid.restype = ctypes.c_int
_api.PyCapsule_IsValid.argtypes = [ctypes.py_object, ctypes.c_char_p]
# the destructor runs while the capsule is being freed: it is reached by address, never as an object
_capsule_pointer = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_char_p)(
    ("PyCapsule_GetPointer", _api))
_capsule_valid = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p)(("PyCapsule_IsValid", _api))

_NUMPY_OF = {(_INT, 8): np.int8, (_INT, 16): np.int16, (_INT, 32): np.int32, (_INT, 64): np.int64,
             (_UINT, 8): np.uint8, (_UINT, 16): np.uint16, (_UINT, 32): np.uint32, (_UINT, 64): np.uint64,
             (_FLOAT, 16): np.float16, (_FLOAT, 32): np.float32, (_FLOAT, 64): np.float64, (_BOOL, 8): np.bool_}
_CODE_OF = {np.dtype(t): key for key, t in _NUMPY_OF.items()}


@dataclass
class Borrowed:
    """A producer's tensor, taken from its capsule: valid until `release()`."""

    pointer: int
    device: tuple[int, int]
    shape: tuple[int, ...]
    dtype: np.dtype
    release: Callable[[], None]

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize


def borrow(capsule: Any) -> Borrowed:
    """Take a "dltensor" capsule as its consumer. The tensor must be dense and row-major (strides
    absent, or those of a C-contiguous array); it stays the producer's until `release()`."""
    if not _api.PyCapsule_IsValid(capsule, CAPSULE_NAME):
        raise ValueError("not an unused DLPack capsule (a capsule named 'dltensor')")
    address = _api.PyCapsule_GetPointer(capsule, CAPSULE_NAME)
    managed = _ManagedTensor.from_address(address)
    tensor = managed.dl_tensor
    shape = tuple(int(tensor.shape[i]) for i in range(tensor.ndim))
    key = (tensor.dtype.code, tensor.dtype.bits)
    if tensor.dtype.lanes != 1 or key not in _NUMPY_OF:
        raise ValueError(f"DLPack data type (code {key[0]}, {key[1]} bits, {tensor.dtype.lanes} lanes) has no "
                         "counterpart among Triton's data types")
    dtype = np.dtype(_NUMPY_OF[key])
    if tensor.strides:
        expected = 1
        for i in reversed(range(tensor.ndim)):
            if shape[i] != 1 and int(tensor.strides[i]) != expected:
                raise ValueError(f"the DLPack tensor of shape {list(shape)} is not contiguous: make it so first")
            expected *= shape[i]
    _api.PyCapsule_SetName(capsule, USED_CAPSULE_NAME)  # ours now: its destructor must not free it
    deleter = managed.deleter
    released = threading.Lock()

    def release() -> None:
        if released.acquire(blocking=False) and deleter:
            deleter(ctypes.cast(address, ctypes.POINTER(_ManagedTensor)))

    pointer = (tensor.data or 0) + int(tensor.byte_offset)
    return Borrowed(pointer, (int(tensor.device.device_type), int(tensor.device.device_id)), shape, dtype, release)


# exported tensors, by the address of their DLManagedTensor: the struct, its shape, and its owner
_exported: dict[int, tuple[_ManagedTensor, Any, Any]] = {}
_exported_lock = threading.Lock()


def _delete(managed) -> None:
    with _exported_lock:
        _exported.pop(ctypes.addressof(managed.contents), None)


def _destroy_capsule(capsule_address: int) -> None:
    if _capsule_valid(capsule_address, CAPSULE_NAME):  # never taken by a consumer
        with _exported_lock:
            _exported.pop(_capsule_pointer(capsule_address, CAPSULE_NAME), None)


_deleter = _DELETER(_delete)
_capsule_destructor = _CAPSULE_DESTRUCTOR(_destroy_capsule)


def exportable(dtype: np.dtype) -> bool:
    """Whether `export` can describe elements of this numpy type."""
    return np.dtype(dtype) in _CODE_OF


def export(pointer: int, device: tuple[int, int], shape: tuple[int, ...], dtype: np.dtype, owner: Any) -> Any:
    """A "dltensor" capsule over `pointer` (dense, row-major), which `owner` keeps valid: the owner is
    held until the consumer is done with the memory."""
    dtype = np.dtype(dtype)
    if dtype not in _CODE_OF:
        raise ValueError(f"numpy type {dtype} has no DLPack counterpart")
    code, bits = _CODE_OF[dtype]
    dims = (ctypes.c_int64 * max(len(shape), 1))(*shape)
    managed = _ManagedTensor()
    managed.dl_tensor = _Tensor(pointer, _Device(*device), len(shape), _DataType(code, bits, 1),
                                ctypes.cast(dims, ctypes.POINTER(ctypes.c_int64)), None, 0)
    managed.deleter = _deleter
    address = ctypes.addressof(managed)
    with _exported_lock:
        _exported[address] = (managed, dims, owner)
    return _api.PyCapsule_New(address, CAPSULE_NAME, _capsule_destructor)


def exported_count() -> int:
    """How many exported capsules still hold their owners (for tests)."""
    return len(_exported)
