"""The arenas a worker writes its outputs into, and their lending.

A worker fills one output arena per batch, from offset 0. Large outputs are not copied out of it:
the frontend hands them on as numpy views of the arena (for the in-process API, to the caller; for
HTTP and gRPC, to the response being written), and the arena is *lent* until the last view of it
is gone. The next batch then goes to another arena of the instance. An instance has MAX_ARENAS,
made and mapped by both sides when the worker starts, so that their names are unlinked at once
(nothing is left in /dev/shm after a SIGKILL); a spare costs address space only until it is first
written, and then keeps its pages, so it fills at memory speed. When all are lent, outputs are
copied out as before: a caller that keeps every output forever costs memory once, never unbounded.

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
    """One worker incarnation's output arenas: `current` (index `index`) is where its next batch writes."""

    def __init__(self, make: Callable[[int], Arena], count: int = MAX_ARENAS):
        self.all = [make(k) for k in range(count)]  # the k-th: a new shared-memory segment
        self.index = 0
        self._returned: collections.deque[int] = collections.deque(range(1, count))  # appended from any thread
        self._closed = False

    @property
    def current(self) -> Arena:
        return self.all[self.index]

    def reader(self) -> Callable[[int, int], memoryview]:
        """The bytes of one batch's outputs, for its decoding: `read(offset, nbytes)`. The first large
        output lends the batch's arena, if another can take the next batch; the rest are copied."""
        arena = self.current
        owner: list[np.ndarray] = []

        def read(offset: int, nbytes: int) -> memoryview:
            if nbytes >= LEND_MIN and (owner or self._lend(arena, owner)):
                return memoryview(owner[0][offset:offset + nbytes])
            return buffers.copy_of(arena.view[offset:offset + nbytes])

        return read

    def _lend(self, arena: Arena, owner: list) -> bool:
        if not self._returned:
            return False
        whole = np.frombuffer(arena.map, np.uint8)
        weakref.finalize(whole, self._give_back, self.index)
        owner.append(whole)
        self.index = self._returned.popleft()
        return True

    def _give_back(self, index: int) -> None:  # any thread
        if self._closed:
            self.all[index].close()
        else:
            self._returned.append(index)

    def unlink(self) -> None:
        """The worker has mapped them all: their names can go."""
        for arena in self.all:
            arena.unlink()

    def close(self) -> None:
        """Unlink and unmap them all; a lent arena stays mapped until its last view is gone."""
        self._closed = True
        for arena in self.all:
            arena.close()
