"""The server's HTTP/2 connection driven in-process, for the tests of its frames and bounds: a
transport that records what the connection does with it, and a harness that feeds the connection
bytes as the event loop would."""

from __future__ import annotations

import asyncio

from tritonmp.frontends import http2

from hostile_clients import PREFACE, SETTINGS, h2frame


class Transport:
    """What the connection asks of an asyncio transport, recording it."""

    def __init__(self):
        self.written: list[bytes] = []
        self.closed = False
        self.paused = 0  # pause_reading calls less resume_reading calls

    def write(self, data):
        self.written.append(bytes(data))

    def writelines(self, parts):
        self.written.extend(bytes(p) for p in parts)

    def pause_reading(self):
        self.paused += 1

    def resume_reading(self):
        self.paused -= 1

    def is_closing(self):
        return self.closed

    def can_write_eof(self):
        return False

    def close(self):
        self.closed = True

    abort = close

    def get_extra_info(self, *_):
        return None

    def frames(self) -> list[tuple[int, int, int, bytes]]:
        data = b"".join(self.written)
        out, pos = [], 0
        while pos + 9 <= len(data):
            length = int.from_bytes(data[pos:pos + 3], "big")
            out.append((data[pos + 3], data[pos + 4], int.from_bytes(data[pos + 5:pos + 9], "big") & 0x7FFFFFFF,
                        data[pos + 9:pos + 9 + length]))
            pos += 9 + length
        return out

    def goaway(self) -> int | None:
        """The error code of the GOAWAY sent, if any."""
        codes = [int.from_bytes(p[4:8], "big") for kind, _, _, p in self.frames() if kind == http2.GOAWAY]
        return codes[0] if codes else None


class Handler:
    def __init__(self, stream):
        self.stream, self.chunks, self.ended, self.was_reset = stream, [], False, False

    def data(self, chunk):
        self.chunks.append(bytes(chunk))

    def end(self):
        self.ended = True

    def reset(self):
        self.was_reset = True


class Harness:
    """A connection on a recording transport; `feed` hands it bytes as the event loop would (in
    reads of the size its buffer offers) and lets the loop turn until it has handled them."""

    def __init__(self, keepalive: http2.Keepalive | None = None):
        self.handlers: list[Handler] = []
        self.transport = Transport()
        self.conn = http2.Connection(self._open, keepalive=keepalive or http2.Keepalive(time=0, preface_timeout=0))
        self.conn.connection_made(self.transport)
        self.conn.data_received(PREFACE + h2frame(SETTINGS, 0, 0))

    def _open(self, conn, stream):
        handler = Handler(stream)
        self.handlers.append(handler)
        return handler

    async def feed(self, data: bytes) -> None:
        view = memoryview(data)
        while view.nbytes and not self.conn.closed:
            buffer = self.conn.get_buffer(-1)
            n = min(buffer.nbytes, view.nbytes)
            buffer[:n] = view[:n]
            self.conn.buffer_updated(n)
            view = view[n:]
            while self.conn.backlog and not self.conn.closed:  # as the loop does with reading paused
                await asyncio.sleep(0)
