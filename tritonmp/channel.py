"""The frontend's end of one worker's socket: an asyncio protocol that reads each message
straight into a buffer of its exact size and hands it to the instance, and a gather-write send.

A worker gets a fresh socketpair for every incarnation, so a message can only come from the
incarnation it belongs to, and the socket's end is itself a sign of the worker's death.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from . import transport

log = logging.getLogger("tritonmp.channel")


class Channel(asyncio.BufferedProtocol):
    def __init__(self, on_message: Callable, on_lost: Callable[[], None]):
        self.on_message = on_message
        self.on_lost = on_lost
        self.transport: asyncio.Transport | None = None
        self._prefix = bytearray(transport.LENGTH.size)
        self._prefix_view = memoryview(self._prefix)
        self._filled = 0
        self._body: bytearray | None = None
        self._body_view: memoryview | None = None

    def connection_made(self, t) -> None:
        self.transport = t

    def get_buffer(self, sizehint: int) -> memoryview:
        if self._body is None:
            return self._prefix_view[self._filled:]
        return self._body_view[self._filled:]

    def buffer_updated(self, nbytes: int) -> None:
        self._filled += nbytes
        if self._body is None:
            if self._filled < len(self._prefix):
                return
            (total,) = transport.LENGTH.unpack(self._prefix)
            self._body = bytearray(total)
            self._body_view = memoryview(self._body)
            self._filled = 0
            if total:
                return
        if self._filled < len(self._body):
            return
        body = self._body_view
        self._body = self._body_view = None
        self._filled = 0
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
