"""A server-side HTTP/2 connection (RFC 9113) on an asyncio protocol: framing, HPACK decoding
of request headers (the `hpack` library), stream states, flow control both ways, PING, GOAWAY.

It knows nothing of gRPC: each new request stream is handed to the application's `StreamHandler`
(made by a factory), which receives the stream's data and answers through the connection's send
methods. Response header blocks are built by the caller (see `header_block`): the server never
indexes what it sends, so its HPACK encoder needs no state.
"""

from __future__ import annotations

import asyncio
import struct
from dataclasses import dataclass
from typing import Protocol

import hpack

from ..logs import get_logger

log = get_logger("http2")

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = range(10)
FLAG_END_STREAM = 0x1
FLAG_ACK = 0x1
FLAG_END_HEADERS = 0x4
FLAG_PADDED = 0x8
FLAG_PRIORITY = 0x20

NO_ERROR, PROTOCOL_ERROR, INTERNAL_ERROR, FLOW_CONTROL_ERROR = 0x0, 0x1, 0x2, 0x3
STREAM_CLOSED, FRAME_SIZE_ERROR, REFUSED_STREAM, CANCEL, COMPRESSION_ERROR = 0x5, 0x6, 0x7, 0x8, 0x9
ENHANCE_YOUR_CALM = 0xB

SETTINGS_HEADER_TABLE_SIZE, SETTINGS_ENABLE_PUSH, SETTINGS_MAX_CONCURRENT_STREAMS = 0x1, 0x2, 0x3
SETTINGS_INITIAL_WINDOW_SIZE, SETTINGS_MAX_FRAME_SIZE, SETTINGS_MAX_HEADER_LIST_SIZE = 0x4, 0x5, 0x6

MAX_WINDOW = (1 << 31) - 1
DEFAULT_WINDOW = 65535
DEFAULT_FRAME_SIZE = 16384
# what this server asks of its peers. Chosen on measurement (perf_analyzer, gRPC, FP32 A + B -> C on a
# 2-core machine): with HTTP/2's 64 KiB window and 16 KiB frames a 64 MiB request ran 1.5/s; with a
# 1 MiB window 3.7/s; with 16 MiB and 1 MiB frames 4.0/s (4 MiB at concurrency 4: 72, 85, 98/s); a
# 64 MiB window or 16 MiB frames gained nothing beyond the noise, and the larger window raised p99.
RECV_STREAM_WINDOW = 1 << 24
RECV_CONNECTION_WINDOW = 1 << 30
RECV_FRAME_SIZE = 1 << 20
MAX_HEADER_LIST = 1 << 20
MAX_STREAMS = 1024  # concurrent streams a client may open on one connection (SETTINGS_MAX_CONCURRENT_STREAMS)

_HEAD = struct.Struct(">IBI")  # length (24 bits) and type in one word, flags, stream id
_U32 = struct.Struct(">I")
_SETTING = struct.Struct(">HI")


class ProtocolError(Exception):
    """A connection error: the connection is ended with GOAWAY carrying `code`."""

    def __init__(self, message: str, code: int = PROTOCOL_ERROR):
        super().__init__(message)
        self.code = code


def frame(kind: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    return _HEAD.pack(len(payload) << 8 | kind, flags, stream_id) + payload


def _hpack_int(value: int, prefix_bits: int, first: int) -> bytes:
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes((first | value,))
    out = bytearray((first | limit,))
    value -= limit
    while value >= 128:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def header_block(headers: list[tuple[bytes, bytes]]) -> bytes:
    """Headers as an HPACK block of literals without indexing (RFC 7541 6.2.2), which leave the
    peer's dynamic table untouched; `:status: 200` uses its static-table entry."""
    out = bytearray()
    for name, value in headers:
        if name == b":status" and value == b"200":
            out.append(0x88)
            continue
        out.append(0x00)
        out += _hpack_int(len(name), 7, 0) + name
        out += _hpack_int(len(value), 7, 0) + value
    return bytes(out)


def _only_indexed(block: bytes) -> bool:
    """Whether an HPACK block holds nothing but indexed header fields (RFC 7541 6.1), which leave
    the dynamic table as it was."""
    i, n = 0, len(block)
    while i < n:
        b = block[i]
        if not b & 0x80:
            return False
        i += 1
        if b & 0x7F == 0x7F:  # the index continues in 7-bit groups
            while i < n and block[i] & 0x80:
                i += 1
            i += 1
    return True


class StreamHandler(Protocol):
    """What the application does with one request stream; the connection calls these in order:
    data() any number of times, then end() once the peer has finished sending, or reset() if the
    stream is cancelled (by the peer, or by the connection closing) before the answer is sent.
    A DATA frame's payload may come in several pieces, each a view of the connection's receive
    buffer that is valid only during the call: a handler copies what it keeps, and keeps no view."""

    def data(self, chunk: memoryview) -> None: ...

    def end(self) -> None: ...

    def reset(self) -> None: ...

    # Optional: a handler that gathers a large message into a buffer of its own may offer the
    # buffer's empty part, so that the rest of a DATA payload is read from the socket straight into
    # it: receive_into(limit) gives a view of at most `limit` bytes there, or None; received_into(n)
    # says the first n bytes of it were filled (the same bytes data() would have been given).


class Stream:
    __slots__ = ("id", "headers", "handler", "send_window", "recv_unacked", "remote_closed", "local_closed")

    def __init__(self, stream_id: int, send_window: int):
        self.id = stream_id
        self.headers: dict[bytes, bytes] = {}
        self.handler: StreamHandler | None = None
        self.send_window = send_window
        self.recv_unacked = 0
        self.remote_closed = False
        self.local_closed = False


_CLOSED = Stream(0, 0)  # stands for a stream already closed, in _headers
_REFUSED = Stream(0, 0)  # stands for a new stream refused (after GOAWAY, or past MAX_STREAMS)


@dataclass(frozen=True)
class Keepalive:
    """A connection's timing policy, in seconds, from Triton's gRPC keepalive flags: the server
    PINGs a connection `time` after it last heard from it (only while calls are open unless
    `without_calls`) and closes it when no ACK comes within `timeout`; a connection older than
    `max_age` is sent GOAWAY and closed after `max_age_grace` more (0: never). Also the preface
    deadline and the policy for the client's own PINGs (see Connection._ping_policy)."""

    time: float = 7200.0
    timeout: float = 20.0
    without_calls: bool = False
    max_age: float = 0.0
    max_age_grace: float = 0.0
    preface_timeout: float = 10.0  # a new connection must open with HTTP/2's preface within this (0: no limit)
    # Triton's --grpc-http2-min-recv-ping-interval-without-data (s) and --grpc-http2-max-ping-strikes: a client
    # PING sooner than that after the last while no call is open is a strike; past the strikes, GOAWAY
    min_ping_interval: float = 300.0
    max_ping_strikes: int = 2

    @classmethod
    def from_triton_ms(cls, time_ms: float, timeout_ms: float, permit_without_calls: bool, max_age_ms: float,
                       max_age_grace_ms: float, min_recv_ping_interval_ms: float, max_ping_strikes: int,
                       preface_timeout: float) -> Keepalive:
        """From Triton's gRPC keepalive settings, which count milliseconds (its flags and the
        tritonfrontend Options alike)."""
        return cls(time_ms / 1000, timeout_ms / 1000, permit_without_calls, max_age_ms / 1000, max_age_grace_ms / 1000,
                   preface_timeout, min_recv_ping_interval_ms / 1000, max_ping_strikes)


KEEPALIVE_PING = b"tmp-keep"  # the opaque data of the server's own keepalive PINGs


DIRECT_READ = 64 * 1024  # a DATA payload's rest this large is read straight into its handler's buffer
_SCRATCH = memoryview(bytearray(256 * 1024))  # where every other read lands; the loop's connections share it


class Connection(asyncio.BufferedProtocol):
    """One client connection. `open_stream(connection, stream)` is called once a request's headers
    are complete and returns the stream's handler (it may answer at once, e.g. with an error).

    Reads land in one receive buffer shared by the loop's connections (each read is handled before
    the next one is made, and handlers copy what they keep), except the rest of a large DATA payload
    whose handler offers a buffer of its own (`receive_into`): that is read into it directly, so a
    large message's bytes are copied once, by the kernel."""

    def __init__(self, open_stream, on_close=None, keepalive: Keepalive | None = None, refuse: bool = False):
        self.open_stream = open_stream
        self.on_close = on_close
        self.keepalive = keepalive or Keepalive()
        self.refuse = refuse  # over the listener's connection limit: closed as soon as it opens
        self.timers: dict[str, asyncio.TimerHandle] = {}
        self.loop: asyncio.AbstractEventLoop | None = None  # the serving loop, from connection_made
        self.heard = 0.0  # when the client last sent anything (loop time)
        self.last_ping = float("-inf")  # when the client last sent a PING with no call open
        self.ping_strikes = 0
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.preface_seen = False
        self.decoder = hpack.Decoder()
        self.decoder.max_header_list_size = MAX_HEADER_LIST
        self.header_cache: dict[bytes, dict[bytes, bytes]] = {}
        self.streams: dict[int, Stream] = {}
        self.last_stream_id = 0
        self.peer_frame_size = DEFAULT_FRAME_SIZE
        self.peer_initial_window = DEFAULT_WINDOW
        self.send_window = DEFAULT_WINDOW
        self.recv_unacked = 0
        self.continuing: tuple | None = None  # stream, its id, the first frame's flags, the block so far
        self.goaway_sent = False
        self.closed = False
        self.window_waiters: list[asyncio.Future] = []
        self.drained: asyncio.Future | None = None
        self.write_paused = False
        self.resume_waiters: list[asyncio.Future] = []
        self.pending: list[bytes] = []  # frames written in this loop iteration, sent together at its end
        self.data_left = 0  # bytes still to come of a DATA frame whose payload is handed on as it arrives
        self.data_stream: Stream | None = None  # that frame's stream (None: its payload is dropped)
        self.data_flags = 0
        self.direct: memoryview | None = None  # the handler's buffer the next read goes into, if any

    def _write(self, data: bytes) -> None:
        """Frames go out once per loop iteration: the answers that complete together (a batch)
        leave in one system call."""
        if not self.pending:
            self.loop.call_soon(self._flush)
        self.pending.append(data)

    def _flush(self) -> None:
        pending, self.pending = self.pending, []
        if pending and not self.transport.is_closing():
            self.transport.write(pending[0] if len(pending) == 1 else b"".join(pending))

    # ---- asyncio protocol ----

    def connection_made(self, transport) -> None:
        self.transport = transport
        self.loop = asyncio.get_running_loop()  # once: each lookup costs a getpid system call
        if self.refuse:
            self.closed = True
            transport.abort()
            return
        settings = b"".join(_SETTING.pack(k, v) for k, v in (
            (SETTINGS_ENABLE_PUSH, 0), (SETTINGS_INITIAL_WINDOW_SIZE, RECV_STREAM_WINDOW),
            (SETTINGS_MAX_FRAME_SIZE, RECV_FRAME_SIZE), (SETTINGS_MAX_HEADER_LIST_SIZE, MAX_HEADER_LIST),
            (SETTINGS_MAX_CONCURRENT_STREAMS, MAX_STREAMS)))
        transport.write(frame(SETTINGS, 0, 0, settings)
                        + frame(WINDOW_UPDATE, 0, 0, _U32.pack(RECV_CONNECTION_WINDOW - DEFAULT_WINDOW)))
        loop = self.loop
        self.heard = loop.time()
        if self.keepalive.time > 0:
            self.timers["ping"] = loop.call_later(self.keepalive.time, self._keepalive_ping)
        if self.keepalive.max_age > 0:
            self.timers["age"] = loop.call_later(self.keepalive.max_age, self._aged)
        if self.keepalive.preface_timeout > 0:
            self.timers["preface"] = loop.call_later(self.keepalive.preface_timeout, self._no_preface)

    def _no_preface(self) -> None:
        if not self.preface_seen and not self.closed:
            log.info("closing a gRPC connection that sent no HTTP/2 preface within %gs", self.keepalive.preface_timeout)
            self._close()

    # ---- keepalive and connection age ----

    def _keepalive_ping(self) -> None:
        loop = self.loop
        idle = loop.time() - self.heard
        if self.closed:
            return
        if idle < self.keepalive.time:  # heard from it since: wait out the rest of the period
            self.timers["ping"] = loop.call_later(self.keepalive.time - idle, self._keepalive_ping)
            return
        if not self.streams and not self.keepalive.without_calls:
            self.timers["ping"] = loop.call_later(self.keepalive.time, self._keepalive_ping)
            return
        self._write(frame(PING, 0, 0, KEEPALIVE_PING))
        self.timers["pong"] = loop.call_later(self.keepalive.timeout, self._keepalive_expired)

    def _keepalive_expired(self) -> None:
        log.info("closing a gRPC connection whose client did not answer a keepalive PING within %gs",
                 self.keepalive.timeout)
        self._goaway(NO_ERROR, b"keepalive timeout")
        for stream in list(self.streams.values()):
            self._drop(stream, notify=True)
        self._close()

    def _aged(self) -> None:
        if not self.closed:
            self.loop.create_task(self.shutdown(self.keepalive.max_age_grace or None))

    def get_buffer(self, sizehint: int) -> memoryview:
        if self.data_left and self.data_stream is not None and not self.buffer and not self.closed:
            receive_into = getattr(self.data_stream.handler, "receive_into", None)
            if receive_into is not None:
                region = receive_into(self.data_left)
                if region is not None and region.nbytes >= DIRECT_READ:
                    self.direct = region
                    return region
        self.direct = None
        return _SCRATCH

    def buffer_updated(self, nbytes: int) -> None:
        if self.direct is None:
            self.data_received(_SCRATCH[:nbytes])
            return
        self.direct = None
        if self.closed:
            return
        self.heard = self.loop.time()
        self.data_left -= nbytes
        stream = self.data_stream
        try:
            stream.handler.received_into(nbytes)
            if not self.data_left and not self.closed:
                self.data_stream = None
                self._data_end(stream, self.data_flags)
        except Exception:  # a bug of ours: this connection ends, the server serves on
            log.exception("HTTP/2 connection failed")
            self._goaway(INTERNAL_ERROR)
            self._close()

    def data_received(self, data) -> None:
        """Bytes read from the client (a view valid during the call)."""
        if self.closed:
            return
        self.heard = self.loop.time()
        try:
            if not self.preface_seen:
                if not self._preface(data):
                    return
                data, self.buffer = bytes(self.buffer), bytearray()
            view = memoryview(data)
            if self.data_left:  # the rest of a DATA frame's payload, handed on as it arrives
                n = min(self.data_left, view.nbytes)
                self._data_part(view[:n])
                view = view[n:]
                if self.closed or not view.nbytes:
                    return
            buf = self.buffer
            if not buf:  # frames are read in place; an incomplete one is kept
                used = self._frames(view)
                if used < view.nbytes and not self.closed:
                    buf += view[used:]
            else:
                buf += view
                with memoryview(buf) as held:
                    used = self._frames(held)
                if not self.closed:
                    del buf[:used]
        except ProtocolError as e:
            log.debug("HTTP/2 connection error: %s", e)
            self._goaway(e.code, str(e).encode())
            self._close()
        except hpack.HPACKError as e:
            self._goaway(COMPRESSION_ERROR, str(e).encode())
            self._close()
        except Exception:  # a bug of ours: this connection ends, the server serves on
            log.exception("HTTP/2 connection failed")
            self._goaway(INTERNAL_ERROR)
            self._close()

    def _preface(self, data: bytes) -> bool:
        """Whether the connection preface is complete (what follows it stays in the buffer)."""
        buf = self.buffer
        buf += data
        if len(buf) < len(PREFACE):
            if not PREFACE.startswith(bytes(buf)):
                raise ProtocolError("not an HTTP/2 connection preface")
            return False
        if buf[:len(PREFACE)] != PREFACE:
            raise ProtocolError("not an HTTP/2 connection preface")
        del buf[:len(PREFACE)]
        self.preface_seen = True
        if "preface" in self.timers:
            self.timers.pop("preface").cancel()
        return True

    def _frames(self, view: memoryview) -> int:
        """Handle the complete frames at the start of `view`, and start handing on the payload of a
        DATA frame that is still arriving; returns how many bytes were used. DATA payloads reach the
        stream handlers as views of `view`, which they copy from before returning."""
        pos = 0
        end = view.nbytes
        while end - pos >= 9:
            length = view[pos] << 16 | view[pos + 1] << 8 | view[pos + 2]
            if length > RECV_FRAME_SIZE:
                raise ProtocolError(f"frame of {length} bytes exceeds the maximum frame size", FRAME_SIZE_ERROR)
            kind = view[pos + 3]
            flags = view[pos + 4]
            stream_id = _U32.unpack_from(view, pos + 5)[0] & 0x7FFFFFFF
            if end - pos < 9 + length:
                if kind != DATA or flags & FLAG_PADDED:
                    break
                # a large DATA frame: its payload goes on in pieces, not gathered here first
                self.data_stream = self._data_start(flags, stream_id, length)
                self.data_flags = flags
                self.data_left = length
                self._data_part(view[pos + 9:end])
                return end
            payload = view[pos + 9:pos + 9 + length]
            pos += 9 + length
            if kind == DATA:
                self._data(flags, stream_id, payload)
            else:
                self._frame(kind, flags, stream_id, bytes(payload))
            if self.closed:
                break
        return pos

    def connection_lost(self, exc) -> None:
        self.closed = True
        for timer in self.timers.values():
            timer.cancel()
        self.timers.clear()
        for stream in list(self.streams.values()):
            self._drop(stream, notify=True)
        self._wake_windows()
        for waiter in self.resume_waiters:
            if not waiter.done():
                waiter.set_result(None)
        if self.drained is not None and not self.drained.done():
            self.drained.set_result(None)
        if self.on_close is not None:
            self.on_close(self)

    def pause_writing(self) -> None:
        """The client is not reading what we send: stop reading from it too, so that a flood of
        frames that each need an answer (PING, SETTINGS) cannot grow our send buffer without end."""
        self.write_paused = True
        if self.transport is not None and not self.closed:
            self.transport.pause_reading()

    def resume_writing(self) -> None:
        self.write_paused = False
        if self.transport is not None and not self.closed:
            self.transport.resume_reading()
        waiters, self.resume_waiters = self.resume_waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    # ---- receiving ----

    def _frame(self, kind: int, flags: int, stream_id: int, payload: bytes) -> None:
        if self.continuing is not None and kind != CONTINUATION:
            raise ProtocolError("expected a CONTINUATION frame")
        if kind == HEADERS:
            self._headers(flags, stream_id, payload)
        elif kind == CONTINUATION:
            self._continuation(flags, stream_id, payload)
        elif kind == SETTINGS:
            self._settings(flags, stream_id, payload)
        elif kind == WINDOW_UPDATE:
            self._window_update(stream_id, payload)
        elif kind == PING:
            if stream_id or len(payload) != 8:
                raise ProtocolError("malformed PING", FRAME_SIZE_ERROR if len(payload) != 8 else PROTOCOL_ERROR)
            if not flags & FLAG_ACK:
                self._ping_policy()
                if self.closed:
                    return
                self._write(frame(PING, FLAG_ACK, 0, payload))
            elif payload == KEEPALIVE_PING and "pong" in self.timers:
                self.timers.pop("pong").cancel()
                self.timers["ping"] = self.loop.call_later(self.keepalive.time,
                                                                            self._keepalive_ping)
        elif kind == RST_STREAM:
            if not stream_id or len(payload) != 4:
                raise ProtocolError("malformed RST_STREAM")
            stream = self.streams.get(stream_id)
            if stream is not None:
                self._drop(stream, notify=True)
            elif stream_id > self.last_stream_id:
                raise ProtocolError("RST_STREAM on an idle stream")
        elif kind == GOAWAY:
            if stream_id:
                raise ProtocolError("GOAWAY on a stream")
            self._goaway(NO_ERROR)
            self._close_when_idle()
        elif kind == PRIORITY:
            if not stream_id or len(payload) != 5:
                raise ProtocolError("malformed PRIORITY")
        elif kind == PUSH_PROMISE:
            raise ProtocolError("a client may not push")
        # unknown frame types are ignored (RFC 9113 5.5)

    def _ping_policy(self) -> None:
        """gRPC's policy for client PINGs: with calls open any number is fine; without, one sooner
        than min_ping_interval after the last is a strike, and past max_ping_strikes the connection
        ends with GOAWAY ENHANCE_YOUR_CALM "too_many_pings", as grpc's own servers do. Sending
        headers or data forgives the strikes (`_answered`), as in grpc's servers: clients measure
        the bandwidth with a PING after the data of a response, often once its call has ended."""
        now = self.loop.time()
        if self.streams:
            self.ping_strikes = 0
        elif now - self.last_ping < self.keepalive.min_ping_interval:
            self.ping_strikes += 1
            if self.ping_strikes > self.keepalive.max_ping_strikes:
                self._goaway(ENHANCE_YOUR_CALM, b"too_many_pings")
                self._close()
                return
        if not self.streams:
            self.last_ping = now

    def _answered(self) -> None:
        self.ping_strikes = 0
        self.last_ping = float("-inf")

    def _strip_padding(self, flags: int, payload: bytes) -> bytes:
        if flags & FLAG_PADDED:
            if not payload or payload[0] >= len(payload):
                raise ProtocolError("padding exceeds the frame")
            return payload[1:len(payload) - payload[0]]
        return payload

    def _data(self, flags: int, stream_id: int, payload: memoryview) -> None:
        stream = self._data_start(flags, stream_id, len(payload))
        if stream is None:
            return
        chunk = self._strip_padding(flags, payload)
        if chunk:
            stream.handler.data(chunk)
        self._data_end(stream, flags)

    def _data_start(self, flags: int, stream_id: int, length: int) -> Stream | None:
        """Flow control and stream state for a DATA frame of `length` bytes; the stream its payload
        goes to, or None when it is dropped."""
        if self.continuing is not None:
            raise ProtocolError("expected a CONTINUATION frame")
        if not stream_id:
            raise ProtocolError("DATA on stream 0")
        self._consumed_connection(length)
        stream = self.streams.get(stream_id)
        if stream is None:
            if stream_id > self.last_stream_id:
                raise ProtocolError("DATA on an idle stream")
            return None  # a stream this side has closed or reset: ignored (RFC 9113 5.1)
        if stream.remote_closed:
            self._reset(stream_id, STREAM_CLOSED)
            self._drop(stream, notify=True)
            return None
        stream.recv_unacked += length
        if stream.recv_unacked > RECV_STREAM_WINDOW:
            self._reset(stream_id, FLOW_CONTROL_ERROR)
            self._drop(stream, notify=True)
            return None
        if flags & FLAG_END_STREAM:
            stream.remote_closed = True  # the peer sends no more than this frame
        elif stream.recv_unacked >= RECV_STREAM_WINDOW // 2:
            self._write(frame(WINDOW_UPDATE, 0, stream_id, _U32.pack(stream.recv_unacked)))
            stream.recv_unacked = 0
        return stream

    def _data_part(self, chunk: memoryview) -> None:
        """A piece of the DATA frame being handed on as it arrives."""
        self.data_left -= chunk.nbytes
        stream = self.data_stream
        if stream is None:
            return
        if chunk.nbytes:
            stream.handler.data(chunk)
        if not self.data_left:
            self.data_stream = None
            self._data_end(stream, self.data_flags)

    def _data_end(self, stream: Stream, flags: int) -> None:
        if flags & FLAG_END_STREAM and stream.handler is not None:
            stream.handler.end()

    def _consumed_connection(self, n: int) -> None:
        self.recv_unacked += n
        if self.recv_unacked > RECV_CONNECTION_WINDOW:
            raise ProtocolError("the peer overran the connection's flow-control window", FLOW_CONTROL_ERROR)
        if self.recv_unacked >= RECV_CONNECTION_WINDOW // 2:
            self._write(frame(WINDOW_UPDATE, 0, 0, _U32.pack(self.recv_unacked)))
            self.recv_unacked = 0

    def _headers(self, flags: int, stream_id: int, payload: bytes) -> None:
        if not stream_id or not stream_id & 1:
            raise ProtocolError("HEADERS on an invalid stream id")
        payload = self._strip_padding(flags, payload)
        if flags & FLAG_PRIORITY:
            payload = payload[5:]
        stream = self.streams.get(stream_id)
        if stream is None:
            if stream_id <= self.last_stream_id:
                stream = _CLOSED  # decoded to keep the HPACK state in step, then ignored
            else:
                self.last_stream_id = stream_id
                # past the advertised limit the stream is refused (its headers still decoded, for HPACK)
                refuse = self.goaway_sent or len(self.streams) >= MAX_STREAMS
                stream = _REFUSED if refuse else Stream(stream_id, self.peer_initial_window)
        elif stream.remote_closed:
            raise ProtocolError("HEADERS on a half-closed stream", STREAM_CLOSED)
        if flags & FLAG_END_HEADERS:
            self._header_block(stream, stream_id, flags, payload)
        else:
            self.continuing = (stream, stream_id, flags, bytearray(payload))

    def _continuation(self, flags: int, stream_id: int, payload: bytes) -> None:
        if self.continuing is None or self.continuing[1] != stream_id:
            raise ProtocolError("unexpected CONTINUATION frame")
        stream, _, first_flags, block = self.continuing
        block += payload
        if len(block) > MAX_HEADER_LIST:
            raise ProtocolError("header block too large")
        if flags & FLAG_END_HEADERS:
            self.continuing = None
            self._header_block(stream, stream_id, first_flags, bytes(block))

    def _decode(self, block: bytes) -> dict[bytes, bytes]:
        """A header block as a dict. Clients repeat the same headers on every call, which after the
        first call are references into the dynamic table, so their blocks repeat byte for byte:
        such a block only reads the table, and its decoding is kept until the table changes."""
        headers = self.header_cache.get(block)
        if headers is None:
            headers = dict(self.decoder.decode(block, raw=True))
            if _only_indexed(block):
                if len(self.header_cache) >= 64:
                    self.header_cache.clear()
                self.header_cache[block] = headers
            else:  # the block may have added to or resized the table: earlier decodings are stale
                self.header_cache.clear()
        return headers

    def _header_block(self, stream: Stream, stream_id: int, flags: int, block: bytes) -> None:
        headers = self._decode(block)
        if stream is _CLOSED:
            return
        if stream is _REFUSED:  # after GOAWAY: the client may retry it elsewhere
            self._reset(stream_id, REFUSED_STREAM)
            return
        end_stream = bool(flags & FLAG_END_STREAM)
        if stream.handler is not None:  # trailers
            if not end_stream:
                raise ProtocolError("trailers without END_STREAM")
            stream.remote_closed = True
            stream.handler.end()
            return
        stream.headers = headers  # shared with the decoding cache: read, never changed
        stream.remote_closed = end_stream
        self.streams[stream_id] = stream
        stream.handler = self.open_stream(self, stream)
        if end_stream and stream.id in self.streams:
            stream.handler.end()

    def _settings(self, flags: int, stream_id: int, payload: bytes) -> None:
        if stream_id:
            raise ProtocolError("SETTINGS on a stream")
        if flags & FLAG_ACK:
            if payload:
                raise ProtocolError("SETTINGS ACK with a payload", FRAME_SIZE_ERROR)
            return
        if len(payload) % 6:
            raise ProtocolError("malformed SETTINGS", FRAME_SIZE_ERROR)
        for pos in range(0, len(payload), 6):
            key, value = _SETTING.unpack_from(payload, pos)
            if key == SETTINGS_INITIAL_WINDOW_SIZE:
                if value > MAX_WINDOW:
                    raise ProtocolError("initial window too large", FLOW_CONTROL_ERROR)
                delta = value - self.peer_initial_window
                self.peer_initial_window = value
                for stream in self.streams.values():
                    stream.send_window += delta
                if delta > 0:
                    self._wake_windows()
            elif key == SETTINGS_MAX_FRAME_SIZE:
                if not DEFAULT_FRAME_SIZE <= value <= (1 << 24) - 1:
                    raise ProtocolError("invalid SETTINGS_MAX_FRAME_SIZE")
                self.peer_frame_size = value
            elif key == SETTINGS_ENABLE_PUSH and value > 1:
                raise ProtocolError("invalid SETTINGS_ENABLE_PUSH")
        self._write(frame(SETTINGS, FLAG_ACK, 0))

    def _window_update(self, stream_id: int, payload: bytes) -> None:
        if len(payload) != 4:
            raise ProtocolError("malformed WINDOW_UPDATE", FRAME_SIZE_ERROR)
        increment = _U32.unpack(payload)[0] & 0x7FFFFFFF
        if stream_id == 0:
            if not increment:
                raise ProtocolError("WINDOW_UPDATE of zero")
            self.send_window += increment
            if self.send_window > MAX_WINDOW:
                raise ProtocolError("connection window overflow", FLOW_CONTROL_ERROR)
        else:
            stream = self.streams.get(stream_id)
            if stream is None:
                return
            if not increment:
                self._reset(stream_id, PROTOCOL_ERROR)
                self._drop(stream, notify=True)
                return
            stream.send_window += increment
            if stream.send_window > MAX_WINDOW:
                self._reset(stream_id, FLOW_CONTROL_ERROR)
                self._drop(stream, notify=True)
                return
        self._wake_windows()

    # ---- sending ----

    def _wake_windows(self) -> None:
        if not self.window_waiters:  # the common case: every WINDOW_UPDATE comes here
            return
        waiters, self.window_waiters = self.window_waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    def _header_frames(self, stream_id: int, block: bytes, end_stream: bool) -> bytes:
        flags = FLAG_END_STREAM if end_stream else 0
        size = self.peer_frame_size
        if len(block) <= size:
            return frame(HEADERS, flags | FLAG_END_HEADERS, stream_id, block)
        parts = [block[i:i + size] for i in range(0, len(block), size)]
        out = [frame(HEADERS, flags, stream_id, parts[0])]
        for i, part in enumerate(parts[1:], 1):
            out.append(frame(CONTINUATION, FLAG_END_HEADERS if i == len(parts) - 1 else 0, stream_id, part))
        return b"".join(out)

    def is_open(self, stream: Stream) -> bool:
        return not self.closed and self.streams.get(stream.id) is stream

    def send_headers(self, stream: Stream, block: bytes, end_stream: bool = False) -> None:
        """Headers (or trailers, with end_stream) for an open stream; never blocks."""
        if not self.is_open(stream):
            return
        self._answered()
        self._write(self._header_frames(stream.id, block, end_stream))
        if end_stream:
            self._finish(stream)

    def try_send_all(self, stream: Stream, headers: bytes, data: bytes, trailers: bytes) -> bool:
        """Headers, data and trailers in one write when the data fits the flow-control windows
        and one frame; False (nothing sent) otherwise."""
        n = len(data)
        if n > self.send_window or n > stream.send_window or n > self.peer_frame_size or self.write_paused:
            return False
        if not self.is_open(stream):
            return True
        self.send_window -= n
        stream.send_window -= n
        self._answered()
        sid = stream.id
        self._write(self._header_frames(sid, headers, False) + frame(DATA, 0, sid, data)
                             + self._header_frames(sid, trailers, True))
        self._finish(stream)
        return True

    async def send_data(self, stream: Stream, data: bytes | memoryview) -> None:
        """Data on a stream, in frames that respect the peer's frame size and flow-control
        windows; waits for window updates and for the transport to drain as needed."""
        view = memoryview(data)
        loop = self.loop
        while view.nbytes:
            if not self.is_open(stream):
                return
            if self.write_paused:
                waiter = loop.create_future()
                self.resume_waiters.append(waiter)
                await waiter
                continue
            n = min(view.nbytes, self.send_window, stream.send_window, self.peer_frame_size)
            if n <= 0:
                waiter = loop.create_future()
                self.window_waiters.append(waiter)
                await waiter
                continue
            self.send_window -= n
            stream.send_window -= n
            self._answered()
            self._flush()  # what is pending goes first; large data is not held back
            self.transport.writelines((_HEAD.pack(n << 8 | DATA, 0, stream.id), view[:n]))
            view = view[n:]

    def _finish(self, stream: Stream) -> None:
        stream.local_closed = True
        if not stream.remote_closed:
            # the answer is complete before the request: the peer need send no more (RFC 9113 8.1)
            self._reset(stream.id, NO_ERROR)
        self._drop(stream, notify=False)

    def reset_stream(self, stream: Stream, code: int = CANCEL) -> None:
        if self.is_open(stream):
            self._reset(stream.id, code)
            self._drop(stream, notify=False)

    def _reset(self, stream_id: int, code: int) -> None:
        if not self.closed:
            self._write(frame(RST_STREAM, 0, stream_id, _U32.pack(code)))

    def _drop(self, stream: Stream, notify: bool) -> None:
        if self.streams.get(stream.id) is stream:
            del self.streams[stream.id]
        if notify and not stream.local_closed and stream.handler is not None:
            stream.local_closed = True
            stream.handler.reset()
        if not self.streams and self.drained is not None and not self.drained.done():
            self.drained.set_result(None)

    # ---- ending ----

    def _goaway(self, code: int, debug: bytes = b"") -> None:
        if self.closed or self.goaway_sent:
            return
        self.goaway_sent = True
        self._write(frame(GOAWAY, 0, 0, _U32.pack(self.last_stream_id) + _U32.pack(code) + debug))

    def _close(self) -> None:
        if not self.closed:
            self.closed = True
            self._flush()
            self.transport.close()

    def _close_when_idle(self) -> None:
        if not self.streams:
            self._close()
        else:
            self.drained = self.drained or self.loop.create_future()
            self.drained.add_done_callback(lambda _: self._close())

    async def shutdown(self, grace: float | None) -> None:
        """GOAWAY, then wait up to `grace` seconds (None: as long as it takes) for the streams in
        flight to finish, then close; streams still open are reset."""
        self._goaway(NO_ERROR)
        if self.streams and grace != 0:
            self.drained = self.drained or self.loop.create_future()
            try:
                await asyncio.wait_for(asyncio.shield(self.drained), grace)
            except asyncio.TimeoutError:
                pass
        for stream in list(self.streams.values()):
            self._reset(stream.id, CANCEL)
            self._drop(stream, notify=True)
        self._close()
