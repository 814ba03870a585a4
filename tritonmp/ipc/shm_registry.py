"""Client shared-memory regions (system and CUDA): register, status, unregister, and
bounds-checked lookups.

The frontend only checks a region (a system key exists and its window fits the segment; a CUDA
handle has the right size and names a visible GPU); it never maps it. Workers map a region
themselves and read inputs from it or write outputs into it, so tensor bytes that a client placed
in shared memory never pass through the frontend. System and CUDA regions share one namespace of
names, as in Triton.
"""

from __future__ import annotations

import itertools
import os
from dataclasses import dataclass, field

import posix_ipc

from ..errors import ServerError, Status, invalid, not_found

_ids = itertools.count(1)
IPC_HANDLE_SIZE = 64


def new_region_id() -> int:
    """A registration id no other region of this process has (workers key their mappings by it)."""
    return next(_ids)


@dataclass(frozen=True)
class Region:
    name: str
    key: str
    offset: int
    byte_size: int
    id: int  # unique per registration, so a worker never reuses a mapping of a replaced region
    kind: str = "system"  # or "cuda"
    raw_handle: bytes = b""  # cuda: the client's cudaIpcMemHandle
    device_id: int = -1  # cuda: the GPU holding the memory


@dataclass(frozen=True)
class ShmRef:
    """A window of a registered region that holds (or will hold) one tensor's bytes; or of an
    in-process caller's shared array (tritonserver/_api/_shared.py), whose key is a /proc fd path."""

    region: str
    key: str
    offset: int  # from the start of the segment
    nbytes: int
    region_id: int
    raw_handle: bytes = b""  # set for a CUDA region
    device_id: int = -1
    owner: object = field(default=None, compare=False, repr=False)  # what keeps the memory alive meanwhile


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

    def check_allowed(self) -> None:
        if not self.allowed:
            raise ServerError("Client shared memory is disabled on this server; start it with "
                              "--allow-client-shm=true to use shared-memory regions", Status.UNAVAILABLE)

    def register(self, name: str, key: str, offset: int, byte_size: int) -> None:
        self.check_allowed()
        if name in self.regions:
            raise ServerError(f"shared memory region '{name}' already in manager", Status.ALREADY_EXISTS)
        if not key:
            raise invalid(f"shared memory region '{name}' needs a key, an offset >= 0 and a byte_size > 0")
        size = _segment_size(key)  # a key that cannot be opened is said first, as Triton does
        if offset + byte_size > size:  # Triton's words, whether the key is registered already or not
            raise invalid(f"failed to register shared memory region '{name}': invalid args")
        if offset < 0 or byte_size <= 0:  # in Triton's words too, with what is needed
            raise invalid(f"failed to register shared memory region '{name}': invalid args (an offset >= 0 and a "
                          "byte_size > 0 are needed)")
        self.regions[name] = Region(name, key, offset, byte_size, new_region_id())

    def register_cuda(self, name: str, raw_handle: bytes, device_id: int, byte_size: int,
                      gpus: list[int]) -> None:
        self.check_allowed()
        if name in self.regions:
            raise ServerError(f"shared memory region '{name}' already in manager", Status.ALREADY_EXISTS)
        # Triton's words for a handle it cannot open, our reason after them
        if len(raw_handle) != IPC_HANDLE_SIZE:
            raise invalid(f"failed to register shared memory region: invalid args (CUDA shared memory region "
                          f"'{name}' got {len(raw_handle)} bytes, a cudaIpcMemHandle has {IPC_HANDLE_SIZE})")
        if device_id not in gpus:
            raise invalid(f"failed to register shared memory region: invalid args (CUDA shared memory region "
                          f"'{name}': GPU {device_id} is not visible to this server, visible: {gpus})")
        if byte_size <= 0:
            raise invalid(f"CUDA shared memory region '{name}' needs a byte_size > 0")
        self.regions[name] = Region(name, "", 0, byte_size, new_region_id(), "cuda", bytes(raw_handle), device_id)

    def unregister(self, name: str = "", kind: str = "system") -> None:
        """Forget one region of `kind` (no error if unknown, as Triton), or all of that kind."""
        for key in ([name] if name else list(self.regions)):
            region = self.regions.get(key)
            if region is not None and region.kind == kind:
                del self.regions[key]

    def status(self, name: str = "", kind: str = "system") -> list[Region]:
        if not name:
            return [r for r in self.regions.values() if r.kind == kind]
        region = self.regions.get(name)
        if region is None or region.kind != kind:
            raise not_found(f"Unable to find {kind} shared memory region: '{name}'")
        return [region]

    def resolve(self, name: str, offset: int, byte_size: int) -> ShmRef:
        """The window [offset, offset + byte_size) of region `name`, checked against its bounds."""
        self.check_allowed()
        region = self.regions.get(name)
        if region is None:
            raise not_found(f"Unable to find shared memory region: '{name}'")
        if not isinstance(offset, int) or not isinstance(byte_size, int) or offset < 0 or byte_size < 0:
            raise invalid(f"Invalid offset + byte size for shared memory region: '{name}'")
        if offset >= region.byte_size:  # Triton tells an offset past the region from a window too long
            raise invalid(f"Invalid offset for shared memory region: '{name}'")
        if offset + byte_size > region.byte_size:
            raise invalid(f"Invalid offset + byte size for shared memory region: '{name}'")
        return ShmRef(name, region.key, region.offset + offset, byte_size, region.id, region.raw_handle,
                      region.device_id)

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
