"""POSIX shared-memory arenas that carry tensor bytes between the frontend and one worker.

The frontend creates each arena and owns it; the worker maps it by name. Once both sides have
mapped it, the frontend unlinks the name, so nothing is left in /dev/shm even after a SIGKILL.
A worker runs one batch at a time, so an arena is filled from offset 0 for every batch by a
bump allocator. Imported by the frontend and by workers; depends on posix_ipc and numpy.
"""

from __future__ import annotations

import mmap
import os

import numpy as np
import posix_ipc

ALIGN = 64
GIL_FREE_COPY = 1 << 20
PREFIX = "tritonmp-"


class Arena:
    """One mapped shared-memory segment and a bump allocator over it."""

    def __init__(self, name: str, size: int, create: bool):
        flags = posix_ipc.O_CREX if create else 0
        shm = posix_ipc.SharedMemory(name, flags, mode=0o600, size=size if create else 0)
        try:
            self.map = mmap.mmap(shm.fd, shm.size)
        finally:
            shm.close_fd()
        self.name = name
        self.size = self.map.size()
        self.view = memoryview(self.map)
        self.top = 0
        self.linked = create

    def reset(self) -> None:
        self.top = 0

    def alloc(self, nbytes: int) -> int | None:
        """The offset of `nbytes` fresh bytes, or None when the arena is full."""
        offset = self.top
        end = offset + nbytes
        if end > self.size:
            return None
        self.top = (end + ALIGN - 1) & ~(ALIGN - 1)
        return offset

    def write(self, data, offset: int) -> None:
        src = memoryview(data).cast("B")
        dst = self.view[offset:offset + src.nbytes]
        if src.nbytes >= GIL_FREE_COPY:  # numpy copies without the GIL: other threads run meanwhile
            np.copyto(np.frombuffer(dst, np.uint8), np.frombuffer(src, np.uint8))
        else:
            dst[:] = src

    def unlink(self) -> None:
        if self.linked:
            self.linked = False
            try:
                posix_ipc.unlink_shared_memory(self.name)
            except posix_ipc.ExistentialError:
                pass

    def close(self) -> None:
        self.unlink()
        try:
            self.view.release()
            self.map.close()
        except BufferError:
            # a numpy view of the arena is still alive somewhere; the map goes with it
            pass


def segment_name(owner_pid: int, tag: str) -> str:
    return f"/{PREFIX}{owner_pid}-{tag}"


def remove_orphans(shm_dir: str = "/dev/shm") -> list[str]:
    """Unlink arenas left by a tritonmp frontend that no longer runs; returns their names."""
    removed: list[str] = []
    try:
        entries = os.listdir(shm_dir)
    except OSError:
        return removed
    for entry in entries:
        if not entry.startswith(PREFIX):
            continue
        pid_text = entry[len(PREFIX):].split("-", 1)[0]
        if not pid_text.isdigit():
            continue
        try:
            os.kill(int(pid_text), 0)
            continue
        except ProcessLookupError:
            pass
        except PermissionError:
            continue
        try:
            posix_ipc.unlink_shared_memory("/" + entry)
            removed.append(entry)
        except posix_ipc.ExistentialError:
            pass
    return removed
