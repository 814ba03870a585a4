"""The worker's mappings of client shared-memory regions, kept across requests (a region is mapped
once, not per request) and keyed by registration, so a replaced region is never read stale.

A client may shrink its segment while it is registered; touching a mapped page past the segment's
new end would kill the worker with SIGBUS. So each use first checks the segment's size now (one
fstat on the descriptor kept open for that) against the bytes the request needs, and a segment
that is too small fails that request with a clear error instead.
"""

from __future__ import annotations

import mmap
import os
from collections import OrderedDict

import posix_ipc

MAX_MAPPINGS = 32


class ClientRegions:
    def __init__(self) -> None:
        self._maps: OrderedDict[tuple[str, int], tuple[mmap.mmap, memoryview, int]] = OrderedDict()

    def view(self, key: str, region_id: int, need: int = 0) -> memoryview:
        """A writable view of the whole segment `key`, whose first `need` bytes exist; raises
        ValueError when it cannot be opened, or has shrunk below `need` since it was registered."""
        entry = self._maps.get((key, region_id))
        if entry is None:
            entry = self._open(key, region_id)
        else:
            self._maps.move_to_end((key, region_id))
        mapping, view, fd = entry
        size = os.fstat(fd).st_size
        if size < need:
            raise ValueError(f"Invalid shared memory region: '{key}' now holds {size} bytes and the request needs "
                             f"{need}: its client shrank it after registering it")
        return view

    def _open(self, key: str, region_id: int) -> tuple[mmap.mmap, memoryview, int]:
        try:
            if key.startswith("/proc/"):  # an in-process caller's shared array: a descriptor of its process
                fd = os.open(key, os.O_RDWR | os.O_CLOEXEC)
            else:
                fd = posix_ipc.SharedMemory(key).fd
        except (posix_ipc.ExistentialError, posix_ipc.PermissionsError, OSError) as e:
            raise ValueError(f"Unable to open shared memory region: '{key}': {e}") from None
        try:
            mapping = mmap.mmap(fd, os.fstat(fd).st_size)
        except (OSError, ValueError) as e:
            os.close(fd)
            raise ValueError(f"Unable to map shared memory region: '{key}': {e}") from None
        entry = (mapping, memoryview(mapping), fd)  # the descriptor stays open, to check the size at each use
        self._maps[(key, region_id)] = entry
        while len(self._maps) > MAX_MAPPINGS:
            _, (old_map, old_view, old_fd) = self._maps.popitem(last=False)
            os.close(old_fd)
            try:
                old_view.release()
                old_map.close()
            except BufferError:
                pass  # a model still holds an array over it; the mapping goes when that does
        return entry
