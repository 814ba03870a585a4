"""Client system shared-memory regions: register, status, unregister, and bounds-checked lookups.

The frontend only checks a region (its key exists, its window fits the segment); it never maps
it. Workers map a region themselves and read inputs from it or write outputs into it, so tensor
bytes that a client placed in shared memory never pass through the frontend.
"""

from __future__ import annotations

import itertools
import os
from dataclasses import dataclass

import posix_ipc

from .errors import ServerError, Status, invalid, not_found

_ids = itertools.count(1)


@dataclass(frozen=True)
class Region:
    name: str
    key: str
    offset: int
    byte_size: int
    id: int  # unique per registration, so a worker never reuses a mapping of a replaced region


@dataclass(frozen=True)
class ShmRef:
    """A window of a registered region that holds (or will hold) one tensor's bytes."""

    region: str
    key: str
    offset: int  # from the start of the segment
    nbytes: int
    region_id: int


def _segment_size(key: str) -> int:
    try:
        shm = posix_ipc.SharedMemory(key)
    except (posix_ipc.ExistentialError, posix_ipc.PermissionsError, ValueError):
        raise ServerError(f"Unable to open shared memory region: '{key}'", Status.INTERNAL) from None
    try:
        return os.fstat(shm.fd).st_size
    finally:
        shm.close_fd()


class SharedMemoryRegistry:
    def __init__(self, allowed: bool):
        self.allowed = allowed
        self.regions: dict[str, Region] = {}

    def _check_allowed(self) -> None:
        if not self.allowed:
            raise ServerError("client shared memory is disabled on this server; start it with "
                              "--allow-client-shm=true to use shared-memory regions", Status.UNAVAILABLE)

    def register(self, name: str, key: str, offset: int, byte_size: int) -> None:
        self._check_allowed()
        if name in self.regions:
            raise ServerError(f"shared memory region '{name}' already in manager", Status.ALREADY_EXISTS)
        if not key or offset < 0 or byte_size <= 0:
            raise invalid(f"shared memory region '{name}' needs a key, an offset >= 0 and a byte_size > 0")
        if offset + byte_size > _segment_size(key):
            raise ServerError(f"Invalid shared memory region: '{key}'", Status.INTERNAL)
        self.regions[name] = Region(name, key, offset, byte_size, next(_ids))

    def unregister(self, name: str = "") -> None:
        """Forget one region (no error if unknown, as Triton), or all of them without a name."""
        if name:
            self.regions.pop(name, None)
        else:
            self.regions.clear()

    def status(self, name: str = "") -> list[Region]:
        if not name:
            return list(self.regions.values())
        region = self.regions.get(name)
        if region is None:
            raise not_found(f"Unable to find system shared memory region: '{name}'")
        return [region]

    def resolve(self, name: str, offset: int, byte_size: int) -> ShmRef:
        """The window [offset, offset + byte_size) of region `name`, checked against its bounds."""
        self._check_allowed()
        region = self.regions.get(name)
        if region is None:
            raise not_found(f"Unable to find shared memory region: '{name}'")
        if not isinstance(offset, int) or not isinstance(byte_size, int) or offset < 0 or byte_size < 0 \
                or offset + byte_size > region.byte_size:
            raise invalid(f"Invalid offset + byte size for shared memory region: '{name}'")
        return ShmRef(name, region.key, region.offset + offset, byte_size, region.id)

    def resolve_parameters(self, params: dict) -> ShmRef | None:
        """The region window named by a tensor's shared_memory_* parameters, if it has them."""
        name = params.get("shared_memory_region")
        if name is None:
            return None
        if not isinstance(name, str):
            raise invalid("shared_memory_region must be a string")
        size = params.get("shared_memory_byte_size")
        if size is None:
            raise invalid(f"shared_memory_byte_size is missing for shared memory region '{name}'")
        return self.resolve(name, params.get("shared_memory_offset", 0), size)
