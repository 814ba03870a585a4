"""Arrays that a model's worker reads in place: `Server.shared_array(shape, dtype)`.

An input given as an ordinary numpy array is copied once, into the memory its model's worker
reads. An array made by `shared_array` is that memory already: a memfd (anonymous shared memory,
never a name in /dev/shm) mapped by this process, which a worker maps too, through
/proc/<this pid>/fd/<fd>, the first time a request uses it. A request whose input is such an array,
or a contiguous slice of one, sends the worker only where the bytes are; nothing is copied.

The caller fills the array before the request and must not change it until the response has
come, as with a client's shared-memory region. The memory goes when the last view of the array
is gone (a worker keeps its last few mappings open for reuse; see tritonmp/workers/client_shm.py). Reuse an
array across requests rather than making one per request: making and first touching shared
memory costs more than copying into memory that is already mapped.
"""

from __future__ import annotations

import mmap
import os
import threading
import weakref

import numpy as np

from ...ipc.shm_registry import ShmRef, new_region_id

REGION = "<shared array>"  # the region name that errors about these arrays mention


class _Segment:
    __slots__ = ("base", "fd", "key", "region_id", "address", "size")

    def __init__(self, base: np.ndarray, fd: int, region_id: int):
        self.base = weakref.ref(base)
        self.fd = fd
        self.key = f"/proc/{os.getpid()}/fd/{fd}"
        self.region_id = region_id
        self.address = base.__array_interface__["data"][0]
        self.size = base.nbytes


class SharedArrays:
    """The shared arrays of one server, found again from any view of them."""

    def __init__(self) -> None:
        self._segments: dict[int, _Segment] = {}  # by id() of the array that owns the mapping
        self._lock = threading.Lock()

    def allocate(self, shape, dtype) -> np.ndarray:
        dtype = np.dtype(dtype)
        if dtype.hasobject:
            raise TypeError("a shared array holds fixed-size values; BYTES tensors are serialized per request")
        shape = tuple(int(d) for d in (shape if isinstance(shape, (tuple, list)) else (shape,)))
        if any(d < 0 for d in shape):
            raise ValueError(f"invalid shape {shape}")
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        fd = os.memfd_create("tritonmp-shared-array", os.MFD_CLOEXEC)
        try:
            os.ftruncate(fd, max(nbytes, 1))
            mapping = mmap.mmap(fd, max(nbytes, 1))
        except BaseException:
            os.close(fd)
            raise
        base = np.frombuffer(mapping, np.uint8)  # owns the mapping; every view's base
        segment = _Segment(base, fd, new_region_id())
        with self._lock:
            self._segments[id(base)] = segment
        weakref.finalize(base, self._release, id(base), fd)
        return base[:nbytes].view(dtype).reshape(shape)

    def _release(self, owner: int, fd: int) -> None:  # when the last view is gone, on any thread
        with self._lock:
            self._segments.pop(owner, None)
        os.close(fd)

    def ref(self, array: np.ndarray) -> ShmRef | None:
        """Where a C-contiguous view of a shared array lies, for the worker; None for any other array."""
        base = array.base
        if not isinstance(base, np.ndarray) or not self._segments:
            return None
        segment = self._segments.get(id(base))
        if segment is None or segment.base() is not base or not array.flags.c_contiguous:
            return None
        offset = array.__array_interface__["data"][0] - segment.address
        return ShmRef(REGION, segment.key, offset, array.nbytes, segment.region_id, owner=base)
