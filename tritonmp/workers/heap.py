"""The worker's heap policy: memory a model frees is kept for its next allocations.

glibc hands every block of 32 MiB or more back to the kernel the moment it is freed (they are
mmap'd), and trims the top of its heap past a few MiB. A model that makes a large array per request
(`np.add(a, b)` on 64 MiB inputs, a decoded image) then maps fresh memory each time, and the kernel
faults in and zeroes every page of it again: at 64 MiB, about a quarter of the worker's time per
request. With a retain limit, the worker's allocations come from its heap (no mmap per block) and up to
that many bytes freed at the heap's top stay mapped, so the next request's array reuses pages that
are already there. The worker's resident memory then stays at its high-water mark while it is busy;
after IDLE_S seconds without a batch everything free is handed back (malloc_trim).

A C library without mallopt (musl) keeps its own behaviour; nothing here is required for correctness.
"""

from __future__ import annotations

import ctypes
import threading
import time

from tritonmp import testing

M_TRIM_THRESHOLD = -1
M_MMAP_MAX = -4
IDLE_S = testing.worker_idle_trim_s(10.0)
_INT_MAX = (1 << 31) - 1


def _libc():
    try:
        libc = ctypes.CDLL(None)
        return libc if hasattr(libc, "mallopt") and hasattr(libc, "malloc_trim") else None
    except OSError:
        return None


class HeapRetention:
    """Set up in the worker before its model loads; `used()` after each batch."""

    def __init__(self, retain_bytes: int):
        self.libc = _libc() if retain_bytes > 0 else None
        self.active = False
        if self.libc is None:
            return
        limit = min(retain_bytes, _INT_MAX)  # the CLI allows 2047 MiB at most; mallopt takes an int
        self.active = bool(self.libc.mallopt(M_MMAP_MAX, 0)) and bool(self.libc.mallopt(M_TRIM_THRESHOLD, limit))
        self.last_use = time.monotonic()
        self.trimmed = False
        if self.active:
            threading.Thread(target=self._trim_when_idle, name="worker-heap-trim", daemon=True).start()

    def used(self) -> None:
        self.last_use = time.monotonic()
        self.trimmed = False

    def _trim_when_idle(self) -> None:
        libc = self.libc
        assert libc is not None, "started only where the C library's allocator is tuned"
        wake = threading.Event()
        while True:
            wake.wait(IDLE_S)
            if not self.trimmed and time.monotonic() - self.last_use >= IDLE_S:
                self.trimmed = True
                libc.malloc_trim(0)
