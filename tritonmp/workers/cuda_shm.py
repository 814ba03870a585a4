"""CUDA shared memory in the worker: open a client's cudaIpcMemHandle on this instance's GPU and
copy tensor bytes between that device memory and the host.

Uses the CUDA runtime's C API through ctypes (libcudart from the nvidia-cuda-runtime wheel of the
`gpu` extra, or the system's), so it depends on no binding's Python API. Loaded only by workers
that are handed a CUDA region; the frontend never loads CUDA.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import glob
import os
from collections import OrderedDict

IPC_HANDLE_SIZE = 64
_IPC_LAZY_ENABLE_PEER_ACCESS = 1
_H2D, _D2H, _DEFAULT = 1, 2, 4
MAX_HANDLES = 32


class _IpcHandle(ctypes.Structure):
    _fields_ = [("reserved", ctypes.c_char * IPC_HANDLE_SIZE)]


def ipc_handle(raw_handle: bytes) -> _IpcHandle:
    """The handle's 64 bytes as the C struct, byte for byte (assigning bytes to a c_char array
    field would stop at the first NUL, and handles are full of them)."""
    if len(raw_handle) != IPC_HANDLE_SIZE:
        raise ValueError(f"a cudaIpcMemHandle has {IPC_HANDLE_SIZE} bytes, got {len(raw_handle)}")
    return _IpcHandle.from_buffer_copy(raw_handle)


def _find_cudart() -> str:
    """libcudart: TRITONMP_CUDART, else NVIDIA's runtime wheel (nvidia/cuda_runtime/lib for CUDA 12,
    nvidia/cu13/lib for CUDA 13), else the system's (the loader's cache, then the toolkit's folder)."""
    explicit = os.environ.get("TRITONMP_CUDART")
    if explicit:
        return explicit
    try:
        import nvidia  # the namespace package of NVIDIA's wheels

        for base in nvidia.__path__:
            found = sorted(glob.glob(os.path.join(base, "*", "lib", "libcudart.so*")))
            if found:
                return found[0]
    except ImportError:
        pass
    name = ctypes.util.find_library("cudart")
    if name:
        return name
    found = sorted(glob.glob("/usr/local/cuda/lib64/libcudart.so*"))
    if found:
        return found[0]
    raise ValueError("the CUDA runtime (libcudart) is not installed; install tritonmp[gpu] to use CUDA "
                     "shared memory")


class CudaRuntime:
    def __init__(self, device: int = 0) -> None:
        lib = ctypes.CDLL(_find_cudart())
        self.lib = lib
        lib.cudaIpcOpenMemHandle.argtypes = [ctypes.POINTER(ctypes.c_void_p), _IpcHandle, ctypes.c_uint]
        lib.cudaIpcCloseMemHandle.argtypes = [ctypes.c_void_p]
        lib.cudaMemcpy.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        lib.cudaSetDevice.argtypes = [ctypes.c_int]
        lib.cudaGetErrorString.restype = ctypes.c_char_p
        lib.cudaMalloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]
        lib.cudaFree.argtypes = [ctypes.c_void_p]
        lib.cudaMemcpyAsync.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,
                                        ctypes.c_void_p]
        lib.cudaStreamCreate.argtypes = [ctypes.POINTER(ctypes.c_void_p)]
        lib.cudaStreamSynchronize.argtypes = [ctypes.c_void_p]
        lib.cudaStreamDestroy.argtypes = [ctypes.c_void_p]
        self.set_device(device)  # in a worker, 0: the one GPU CUDA_VISIBLE_DEVICES leaves it

    def set_device(self, device: int) -> None:
        """Make `device` the calling thread's current GPU (CUDA keeps it per thread)."""
        self.check(self.lib.cudaSetDevice(device), f"cudaSetDevice({device})")

    def check(self, code: int, what: str) -> None:
        if code != 0:
            raise ValueError(f"{what} failed: {self.lib.cudaGetErrorString(code).decode()} (CUDA error {code})")

    def open(self, raw_handle: bytes) -> int:
        handle = ipc_handle(raw_handle)
        ptr = ctypes.c_void_p()
        self.check(self.lib.cudaIpcOpenMemHandle(ctypes.byref(ptr), handle, _IPC_LAZY_ENABLE_PEER_ACCESS),
                   "cudaIpcOpenMemHandle")
        return ptr.value or 0

    def close(self, ptr: int) -> None:
        self.lib.cudaIpcCloseMemHandle(ctypes.c_void_p(ptr))

    def to_host(self, ptr: int, nbytes: int) -> bytearray:
        out = bytearray(nbytes)
        if nbytes:
            host = (ctypes.c_char * nbytes).from_buffer(out)
            self.check(self.lib.cudaMemcpy(ctypes.addressof(host), ctypes.c_void_p(ptr), nbytes, _D2H),
                       "cudaMemcpy (device to host)")
        return out

    def to_device(self, ptr: int, data) -> None:
        view = memoryview(data).cast("B")
        if not view.nbytes:
            return
        src = (ctypes.c_char * view.nbytes).from_buffer_copy(view) if view.readonly else \
            (ctypes.c_char * view.nbytes).from_buffer(view)
        self.check(self.lib.cudaMemcpy(ctypes.c_void_p(ptr), ctypes.addressof(src), view.nbytes, _H2D),
                   "cudaMemcpy (host to device)")


    # device memory and streams, for backends that run on the GPU themselves (TensorRT)
    def malloc(self, nbytes: int) -> int:
        ptr = ctypes.c_void_p()
        self.check(self.lib.cudaMalloc(ctypes.byref(ptr), max(nbytes, 1)), f"cudaMalloc of {nbytes} bytes")
        return ptr.value or 0

    def free(self, ptr: int) -> None:
        self.lib.cudaFree(ctypes.c_void_p(ptr))

    def stream(self) -> int:
        handle = ctypes.c_void_p()
        self.check(self.lib.cudaStreamCreate(ctypes.byref(handle)), "cudaStreamCreate")
        return handle.value or 0

    def synchronize(self, stream: int) -> None:
        self.check(self.lib.cudaStreamSynchronize(ctypes.c_void_p(stream)), "cudaStreamSynchronize")

    def destroy_stream(self, stream: int) -> None:
        self.lib.cudaStreamDestroy(ctypes.c_void_p(stream))

    def copy(self, dst: int, src: int, nbytes: int) -> None:
        """Copy between any two addresses (host or device: CUDA tells them apart), waiting for it."""
        if nbytes:
            self.check(self.lib.cudaMemcpy(ctypes.c_void_p(dst), ctypes.c_void_p(src), nbytes, _DEFAULT),
                       "cudaMemcpy")

    def copy_async(self, dst: int, src: int, nbytes: int, stream: int) -> None:
        """Copy between any two addresses (host or device: CUDA tells them apart) on `stream`."""
        if nbytes:
            self.check(self.lib.cudaMemcpyAsync(ctypes.c_void_p(dst), ctypes.c_void_p(src), nbytes, _DEFAULT,
                                                ctypes.c_void_p(stream)), "cudaMemcpyAsync")


def address(buffer) -> int:
    """The address of a writable buffer (a numpy array, a memoryview of shared memory)."""
    view = memoryview(buffer).cast("B")
    return ctypes.addressof((ctypes.c_char * view.nbytes).from_buffer(view)) if view.nbytes else 0


class CudaRegions:
    """Opened client CUDA regions, by registration; opened once, closed when evicted."""

    def __init__(self, device_id: int, kind: str, instance: str):
        self.device_id = device_id
        self.kind = kind
        self.instance = instance
        self.runtime: CudaRuntime | None = None
        self.opened: OrderedDict[int, int] = OrderedDict()

    def pointer(self, raw_handle: bytes, region_id: int, device_id: int) -> int:
        if self.kind != "GPU" or device_id != self.device_id:
            where = f"GPU {self.device_id}" if self.kind == "GPU" else "the CPU"
            raise ValueError(f"CUDA shared memory on GPU {device_id} cannot be used by model instance "
                             f"'{self.instance}', which runs on {where}")
        runtime = self._runtime()
        ptr = self.opened.get(region_id)
        if ptr is None:
            ptr = runtime.open(raw_handle)
            self.opened[region_id] = ptr
            while len(self.opened) > MAX_HANDLES:
                _, old = self.opened.popitem(last=False)
                runtime.close(old)
        return ptr

    def _runtime(self) -> CudaRuntime:
        """The CUDA runtime, loaded on the first use of a CUDA region."""
        if self.runtime is None:
            self.runtime = CudaRuntime()
        return self.runtime

    def device_pointer(self, raw_handle: bytes, region_id: int, device_id: int, offset: int) -> int:
        """The device address `offset` bytes into a client's CUDA region, for backends that write
        their outputs there from the GPU."""
        return self.pointer(raw_handle, region_id, device_id) + offset

    def read(self, raw_handle: bytes, region_id: int, device_id: int, offset: int, nbytes: int) -> bytearray:
        ptr = self.pointer(raw_handle, region_id, device_id)
        return self._runtime().to_host(ptr + offset, nbytes)

    def write(self, raw_handle: bytes, region_id: int, device_id: int, offset: int, data) -> None:
        ptr = self.pointer(raw_handle, region_id, device_id)
        self._runtime().to_device(ptr + offset, data)
