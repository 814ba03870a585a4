"""The frontend's end of the worker transport: one ZeroMQ ROUTER socket on an ipc:// endpoint in
a private runtime directory, and a reader task that hands each message to the instance whose
current incarnation sent it. Messages from unknown (dead, replaced) incarnations are dropped."""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import tempfile

import zmq
import zmq.asyncio

log = logging.getLogger("tritonmp.link")


class WorkerLink:
    def __init__(self) -> None:
        self.runtime_dir = tempfile.mkdtemp(prefix="tritonmp-")
        os.chmod(self.runtime_dir, 0o700)
        self.endpoint = f"ipc://{self.runtime_dir}/workers.sock"
        self.ctx = zmq.asyncio.Context()
        self.sock = self.ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.SNDHWM, 0)
        self.sock.setsockopt(zmq.RCVHWM, 0)
        self.sock.bind(self.endpoint)
        self.handlers: dict[bytes, object] = {}
        self._reader: asyncio.Task | None = None

    def start(self) -> None:
        self._reader = asyncio.get_running_loop().create_task(self._read())

    def register(self, identity: bytes, handler) -> None:
        self.handlers[identity] = handler

    def unregister(self, identity: bytes) -> None:
        self.handlers.pop(identity, None)

    def send(self, identity: bytes, kind: bytes, header: bytes, frames=()) -> None:
        self.sock.send_multipart([identity, kind, header, *frames], copy=False)

    async def _read(self) -> None:
        while True:
            parts = await self.sock.recv_multipart(copy=False)
            handler = self.handlers.get(parts[0].bytes)
            if handler is None:
                continue
            try:
                handler.on_message(parts[1].bytes, parts[2].buffer, parts[3:])
            except Exception:
                log.exception("handling a message from worker %r failed", parts[0].bytes)

    async def close(self) -> None:
        if self._reader is not None:
            self._reader.cancel()
            try:
                await self._reader
            except (asyncio.CancelledError, Exception):
                pass
        self.sock.close(0)
        self.ctx.term()
        shutil.rmtree(self.runtime_dir, ignore_errors=True)
