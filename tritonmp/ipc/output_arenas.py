"""The arenas a worker writes its outputs into, and their lending.

A worker fills one output arena per batch, from offset 0. Large outputs are not copied out of it:
the frontend hands them on as numpy views of the arena (for the in-process API, to the caller; for
HTTP and gRPC, to the response being written), and the arena is *lent* until the last view of it
is gone. The next batch then goes to another arena of the instance; so does a batch sent while
another is in flight (see instances/pool.py), whose outputs must not overwrite those not read yet. An
instance has MAX_ARENAS, made and mapped by both sides when the worker starts, so that their names
are unlinked at once (nothing is left in /dev/shm after a SIGKILL); a spare costs address space only
until it is first written, and then keeps its pages, so it fills at memory speed. When all are
lent, outputs are copied out as before: a caller that keeps every output forever costs memory
once, never unbounded.

Views are slices of one numpy array over the whole arena; numpy keeps that array as the base of
every view taken from it (its own base is the mmap, of another type), so a finalizer on it runs
exactly when the last view, memoryview or DLPack capsule is gone. That can happen on any thread:
a returned arena goes onto a deque, which the event loop reads.
"""

from __future__ import annotations

import collections
import weakref
from collections.abc import Callable

import numpy as np

from . import buffers
from .arena import Arena

LEND_MIN = 64 * 1024  # outputs smaller than this are copied: cheaper than taking an arena out of use
MAX_ARENAS = 4


class OutputArenas:
    """One worker incarnation's output arenas, and which of them are free to take a batch."""

    def __init__(self, make: Callable[[int], Arena], count: int = MAX_ARENAS):
        self.all = [make(k) for k in range(count)]  # the k-th: a new shared-memory segment
        self._free: collections.deque[int] = collections.deque(range(count))  # appended to from any thread
        self._closed = False

    def spare(self) -> bool:
        """Whether a batch can be given an arena now (a free one is left)."""
        return bool(self._free)

    def take(self) -> int:
        """The arena a batch about to be sent writes into: the one used last, while it is free (its
        pages are warm). Free ones are kept so that one always is when no batch is in flight:
        `reader` lends an arena only when another is free."""
        return self._free.popleft()

    def reader(self, index: int) -> Callable[[int, int], memoryview]:
        """The bytes of the outputs of the batch that wrote into arena `index`, for its decoding:
        `read(offset, nbytes)`. The first large output lends the arena, if another is free for the
        next batch; the rest are copied. Call `done(index, read)` after the decoding."""
        arena = self.all[index]
        owner: list[np.ndarray] = []

        def read(offset: int, nbytes: int) -> memoryview:
            if nbytes >= LEND_MIN and (owner or self._lend(arena, index, owner)):
                return owner[0][offset:offset + nbytes].data
            return buffers.copy_of(arena.view[offset:offset + nbytes])

        read.lent = owner  # type: ignore[attr-defined]
        return read

    def done(self, index: int, read: Callable | None = None) -> None:
        """The batch of arena `index` is decoded (or will never be): the arena is free again, unless
        `read` lent it."""
        if read is None or not read.lent:  # type: ignore[attr-defined]
            self._free.appendleft(index)

    def _lend(self, arena: Arena, index: int, owner: list) -> bool:
        if not self._free:
            return False
        whole = np.frombuffer(arena.map, np.uint8)
        weakref.finalize(whole, self._give_back, index)
        owner.append(whole)
        return True

    def _give_back(self, index: int) -> None:  # any thread
        if self._closed:
            self.all[index].close()
        else:
            self._free.append(index)

    def unlink(self) -> None:
        """The worker has mapped them all: their names can go."""
        for arena in self.all:
            arena.unlink()

    def close(self) -> None:
        """Unlink and unmap them all; a lent arena stays mapped until its last view is gone."""
        self._closed = True
        for arena in self.all:
            arena.close()
