"""Large buffers that are cheap to fill: uninitialized numpy memory, and a pool that keeps it.

`bytes(view)` and `bytearray(n)` of tens of MiB go through malloc's mmap path on every call, and
the kernel then faults each 4 KiB page in one at a time (bytearray also zero-fills it first).
numpy asks the kernel for huge pages on large allocations and leaves them uninitialized: copying a
63 MiB tensor into one took 12 ms on a 2-core machine where `bytes()` took 48 ms.

Even so, fresh memory is paid for at first touch: the kernel zeroes (and may compact for) every
page as it faults in. Under concurrent 64 MiB gRPC requests, filling the receive buffers took
about nine times as long as the same copy into the workers' arenas, which are reused. So request
bodies of a MiB or more are received into `RECEIVE_POOL`'s buffers, which are kept and handed out
again once nothing refers to them.
"""

from __future__ import annotations

import asyncio
import sys
import time

import numpy as np


def fresh(nbytes: int) -> memoryview:
    """A writable, uninitialized buffer of `nbytes` bytes."""
    return np.empty(nbytes, np.uint8).data  # ndarray.data: memoryview(the array)


def copy_of(view) -> memoryview:
    """A copy of `view`'s bytes that outlives it (e.g. out of a shared-memory arena about to be reused)."""
    src = np.frombuffer(view, np.uint8)
    out = np.empty(src.nbytes, np.uint8)
    out[:] = src
    return out.data


def nbytes(data) -> int:
    """The size of a tensor's bytes: a memoryview (of any format) or a bytes-like object."""
    return data.nbytes if isinstance(data, memoryview) else len(data)


POOLED = 1 << 20  # buffers this large come from the pool
_MiB = 1 << 20


class BufferPool:
    """Large uninitialized buffers, kept after use and handed out again. A buffer is free once
    nothing refers to it: every view of it holds a reference, so its reference count says when
    the last one has gone. At most `max_bytes` are kept; a buffer left free for `idle` seconds is
    dropped, so memory goes back after a burst. For the event loop's thread only."""

    def __init__(self, max_bytes: int = 1024 * _MiB, idle: float = 10.0):
        self.max_bytes = max_bytes
        self.idle = idle
        self._buffers: list[np.ndarray] = []
        self._stamps: list[float] = []  # when each was last handed out (time.monotonic())
        self._timer: asyncio.TimerHandle | None = None
        self._timer_loop: asyncio.AbstractEventLoop | None = None

    @staticmethod
    def _free(buffers: list, i: int) -> bool:
        # two references: the list's, and getrefcount's own argument
        return sys.getrefcount(buffers[i]) == 2

    def take(self, nbytes: int) -> memoryview:
        """A writable, uninitialized buffer of `nbytes` bytes."""
        if nbytes < POOLED:
            return fresh(nbytes)
        now = time.monotonic()
        buffers = self._buffers
        pick = -1
        for i in range(len(buffers)):
            size = buffers[i].nbytes
            if nbytes <= size <= nbytes + nbytes // 4 + _MiB and self._free(buffers, i) \
                    and (pick < 0 or size < buffers[pick].nbytes):
                pick = i
        if pick < 0:
            size = -(-nbytes // _MiB) * _MiB
            self._trim(now, room=size)
            buffer = np.empty(size, np.uint8)
            if self.kept() + size <= self.max_bytes:
                buffers.append(buffer)
                self._stamps.append(now)
                self._arm()
            return buffer.data[:nbytes]
        self._stamps[pick] = now
        return buffers[pick].data[:nbytes]

    def kept(self) -> int:
        return sum(b.nbytes for b in self._buffers)

    def _trim(self, now: float, room: int = 0) -> None:
        """Drop the buffers free for `idle` seconds, then free ones, oldest first, until `room`
        more bytes fit."""
        keep = [i for i in range(len(self._buffers))
                if not (self._free(self._buffers, i) and now - self._stamps[i] >= self.idle)]
        self._buffers[:] = [self._buffers[i] for i in keep]
        self._stamps[:] = [self._stamps[i] for i in keep]
        while room and self.kept() + room > self.max_bytes:
            free = [i for i in range(len(self._buffers)) if self._free(self._buffers, i)]
            if not free:
                return
            oldest = min(free, key=self._stamps.__getitem__)
            del self._buffers[oldest]
            del self._stamps[oldest]

    def _arm(self) -> None:
        if self._timer is not None and self._timer_loop is not None and not self._timer_loop.is_closed():
            return
        try:
            loop = self._timer_loop = asyncio.get_running_loop()
        except RuntimeError:  # no loop: trimmed at the next take
            self._timer = None
            return
        self._timer = loop.call_later(self.idle, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        self._trim(time.monotonic())
        if self._buffers:
            self._arm()


RECEIVE_POOL = BufferPool()
