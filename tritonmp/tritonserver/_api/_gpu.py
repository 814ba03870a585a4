"""GPU memory of the in-process API, through the CUDA runtime of the `gpu` extra (libcudart).

`DeviceMemory` is device memory this process allocated (an output asked for on a GPU, a tensor
moved there with `Tensor.to_device`), freed when the last reference goes; `BorrowedMemory` is a
DLPack producer's GPU tensor, handed back to it when the last reference goes. Copies are
`cudaMemcpy`s on the legacy default stream, waited for, so memory handed out is ready to use on
any stream.
Nothing here is loaded until a GPU tensor or GPU output is asked for.
"""

from __future__ import annotations

import threading

import numpy as np

from . import _dlpack
from ._errors import UnsupportedError

_runtime = None
_runtime_lock = threading.Lock()


def runtime():
    """The CUDA runtime, loaded on first use; UnsupportedError where there is none or no GPU."""
    global _runtime
    with _runtime_lock:
        if _runtime is None:
            from ...workers.cuda_shm import CudaRuntime

            try:
                _runtime = CudaRuntime()
            except (OSError, ValueError) as exc:
                raise UnsupportedError(f"GPU memory needs the CUDA runtime and a GPU (install tritonmp[gpu]): "
                                       f"{exc}") from None
        return _runtime


class DeviceMemory:
    """`nbytes` bytes of memory on GPU `device_id`, allocated here."""

    def __init__(self, nbytes: int, device_id: int):
        cuda = runtime()
        cuda.set_device(device_id)
        self.pointer = cuda.malloc(nbytes)
        self.nbytes = nbytes
        self.device_id = device_id

    def __del__(self):
        pointer, self.pointer = getattr(self, "pointer", 0), 0
        if pointer and _runtime is not None:
            try:
                _runtime.set_device(self.device_id)
                _runtime.free(pointer)
            except Exception:  # at interpreter exit the runtime may be gone already
                pass


class BorrowedMemory:
    """A DLPack producer's GPU tensor, released to it with the last reference."""

    def __init__(self, borrowed: _dlpack.Borrowed):
        self.pointer = borrowed.pointer
        self.nbytes = borrowed.nbytes
        self.device_id = borrowed.device[1]
        self._release = borrowed.release

    def __del__(self):
        release = getattr(self, "_release", None)
        if release is not None:
            release()


def to_device(array: np.ndarray, device_id: int) -> DeviceMemory:
    """A copy of a host array on GPU `device_id`."""
    array = np.ascontiguousarray(array)
    memory = DeviceMemory(array.nbytes, device_id)
    cuda = runtime()
    cuda.copy(memory.pointer, array.ctypes.data, array.nbytes)
    cuda.synchronize(0)  # from pageable memory cudaMemcpy may return before the DMA is done
    return memory


def copy_to_device(memory, device_id: int) -> DeviceMemory:
    """A copy of GPU memory on GPU `device_id`."""
    copied = DeviceMemory(memory.nbytes, device_id)
    cuda = runtime()
    cuda.copy(copied.pointer, memory.pointer, memory.nbytes)
    cuda.synchronize(0)  # device to device, cudaMemcpy does not wait
    return copied


def to_host(memory, shape, dtype) -> np.ndarray:
    """A host copy of GPU memory, as an array of `shape` and `dtype`."""
    array = np.empty(shape, dtype)
    if array.nbytes:
        runtime().copy(array.ctypes.data, memory.pointer, array.nbytes)
    return array
