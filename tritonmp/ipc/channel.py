"""The frontend's end of one worker's socket: an asyncio protocol that reads messages (small ones
several to a read, large ones straight into a buffer of their exact size) and hands each to the
instance, and a gather-write send.

A worker gets a fresh socketpair for every incarnation, so a message can only come from the
incarnation it belongs to, and the socket's end is itself a sign of the worker's death.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from ..logs import get_logger
from . import buffers, transport

log = get_logger("channel")

SCRATCH = 256 * 1024  # reads land here unless a large message is being filled


class Channel(asyncio.BufferedProtocol):
    def __init__(self, on_message: Callable, on_lost: Callable[[], None]):
        self.on_message = on_message
        self.on_lost = on_lost
        self.transport: asyncio.Transport | None = None
        self._scratch = bytearray(SCRATCH)
        self._view = memoryview(self._scratch)
        self._filled = 0  # bytes of the scratch buffer holding data not yet handed on
        self._body: memoryview | None = None  # a large message being read in place
        self._body_filled = 0

    def connection_made(self, t) -> None:
        self.transport = t

    def get_buffer(self, sizehint: int) -> memoryview:
        if self._body is not None:
            return memoryview(self._body)[self._body_filled:]
        return self._view[self._filled:]

    def buffer_updated(self, nbytes: int) -> None:
        if self._body is not None:
            self._body_filled += nbytes
            if self._body_filled == len(self._body):
                body, self._body = self._body, None
                self._deliver(memoryview(body))
            return
        self._filled += nbytes
        pos = 0
        size = transport.LENGTH.size
        while self._filled - pos >= size:
            (total,) = transport.LENGTH.unpack_from(self._scratch, pos)
            end = pos + size + total
            if end <= self._filled:
                # copy out: the scratch buffer is reused by the next read
                self._deliver(memoryview(bytes(self._view[pos + size:end])))
                pos = end
                continue
            if size + total > SCRATCH:  # too big for the scratch buffer: read the rest in place
                body = buffers.fresh(total)
                have = self._filled - pos - size
                body[:have] = self._view[pos + size:self._filled]
                self._body, self._body_filled = body, have
                pos = self._filled
            break
        if pos:
            rest = self._filled - pos
            self._scratch[:rest] = self._view[pos:self._filled]
            self._filled = rest

    def _deliver(self, body: memoryview) -> None:
        try:
            kind, header, frames = transport.unpack(body)
            self.on_message(kind, header, frames)
        except Exception:
            log.exception("handling a message from a worker failed")

    def connection_lost(self, exc) -> None:
        self.transport = None
        self.on_lost()

    def send(self, kind: bytes, header: bytes, frames=()) -> None:
        if self.transport is not None:
            self.transport.writelines(transport.pack(kind, header, frames))

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()
