"""The worker's mappings of client shared-memory regions, kept across requests (a region is mapped
once, not per request) and keyed by registration, so a replaced region is never read stale."""

from __future__ import annotations

import mmap
from collections import OrderedDict

import posix_ipc

MAX_MAPPINGS = 32


class ClientRegions:
    def __init__(self) -> None:
        self._maps: OrderedDict[tuple[str, int], tuple[mmap.mmap, memoryview]] = OrderedDict()

    def view(self, key: str, region_id: int) -> memoryview:
        """A writable view of the whole segment `key`; raises ValueError when it cannot be opened."""
        entry = self._maps.get((key, region_id))
        if entry is not None:
            self._maps.move_to_end((key, region_id))
            return entry[1]
        try:
            shm = posix_ipc.SharedMemory(key)
        except (posix_ipc.ExistentialError, posix_ipc.PermissionsError) as e:
            raise ValueError(f"Unable to open shared memory region: '{key}': {e}") from None
        try:
            mapping = mmap.mmap(shm.fd, shm.size)
        finally:
            shm.close_fd()
        view = memoryview(mapping)
        self._maps[(key, region_id)] = (mapping, view)
        while len(self._maps) > MAX_MAPPINGS:
            _, (old_map, old_view) = self._maps.popitem(last=False)
            try:
                old_view.release()
                old_map.close()
            except BufferError:
                pass  # a model still holds an array over it; the mapping goes when that does
        return view
