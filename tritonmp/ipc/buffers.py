"""Large buffers that are cheap to fill: uninitialized numpy memory.

`bytes(view)` and `bytearray(n)` of tens of MiB go through malloc's mmap path on every call, and
the kernel then faults each 4 KiB page in one at a time (bytearray also zero-fills it first).
numpy asks the kernel for huge pages on large allocations and leaves them uninitialized: copying a
63 MiB tensor into one took 12 ms on a 2-core machine where `bytes()` took 48 ms.
"""

from __future__ import annotations

import numpy as np


def fresh(nbytes: int) -> memoryview:
    """A writable, uninitialized buffer of `nbytes` bytes."""
    return memoryview(np.empty(nbytes, np.uint8))


def copy_of(view) -> memoryview:
    """A copy of `view`'s bytes that outlives it (e.g. out of a shared-memory arena about to be reused)."""
    src = np.frombuffer(view, np.uint8)
    out = np.empty(src.nbytes, np.uint8)
    out[:] = src
    return memoryview(out)


def nbytes(data) -> int:
    """The size of a tensor's bytes: a memoryview (of any format) or a bytes-like object."""
    return data.nbytes if isinstance(data, memoryview) else len(data)
