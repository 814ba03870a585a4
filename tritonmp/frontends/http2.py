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
import time
from dataclasses import dataclass
from typing import Protocol, TypeVar, cast

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
MAX_STREAMS = 1024  # concurrent streams a client may open on one connection (SETTINGS_MAX_CONCURRENT_STREAMS)

# What one client may make a connection do, in the order of grpc-core's, nghttp2's and Envoy's limits.
# A request's header list (RFC 9113 6.5.2: names and values plus 32 bytes a field, dynamic-table
# references counted at their decoded size): past the soft limit (advertised as
# SETTINGS_MAX_HEADER_LIST_SIZE) the stream is refused and the connection serves on; past the hard
# limit decoding stops, and the connection ends, since the HPACK state is lost.
HEADER_LIST_SOFT = 16 << 10
HEADER_LIST_HARD = 32 << 10
MAX_CONTROL_FRAME = HEADER_LIST_HARD + 256 + 6  # the longest frame other than DATA taken (a HEADERS with padding)
MAX_CONTINUATIONS = 16  # CONTINUATION frames in one header block
MAX_SETTINGS_ENTRIES = 32  # entries in one SETTINGS frame
# Token buckets (burst, per second): streams the client resets or has refused, and frames that ask for
# work without carrying a request (PING, SETTINGS, WINDOW_UPDATE, PRIORITY, empty DATA, unknown types;
# each HEADERS or DATA frame the server sends earns CONTROL_EARNED). Past either: GOAWAY ENHANCE_YOUR_CALM.
RESET_BUDGET = (500, 100.0)
CONTROL_BUDGET = (1000, 100.0)
CONTROL_EARNED = 2
# A connection's input is handled for at most this long in one turn of the event loop; the rest waits,
# with reading paused, for the next turn, so one connection's flood cannot hold the others.
TURN_SECONDS = 0.002
LINGER_SECONDS = 1.0  # a connection ended on an error drops what its client still sends for this long,
LINGER_BYTES = 1 << 20  # and this much (a client that floods on is reset soon), before it closes

Payload = TypeVar("Payload", bytes, memoryview)  # a frame's payload: a copy, or a view of the receive buffer
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


class DirectReceiver(StreamHandler, Protocol):
    """A handler that gathers a large message into a buffer of its own may offer the buffer's empty
    part, so that the rest of a DATA payload is read from the socket straight into it (the
    connection looks for `receive_into`)."""

    def receive_into(self, limit: int) -> memoryview | None:
        """A view of at most `limit` bytes of the buffer's empty part, or None."""

    def received_into(self, n: int) -> None:
        """The first n bytes of that view were filled (the bytes data() would have been given)."""


class Stream:
    """One request stream. Its send window is kept relative to the peer's initial window
    (`window`: the increments it was given less what was sent), so that a change of
    SETTINGS_INITIAL_WINDOW_SIZE reaches every stream at once, without a walk over them."""

    __slots__ = ("id", "headers", "header_size", "handler", "window", "recv_unacked", "remote_closed", "local_closed")

    def __init__(self, stream_id: int):
        self.id = stream_id
        self.headers: dict[bytes, bytes] = {}
        self.header_size = 0  # the header list's size as RFC 9113 6.5.2 counts it
        self.handler: StreamHandler | None = None
        self.window = 0
        self.recv_unacked = 0
        self.remote_closed = False
        self.local_closed = False


_CLOSED = Stream(0)  # stands for a stream already closed, in _headers
_REFUSED = Stream(0)  # stands for a new stream refused (after GOAWAY, or past MAX_STREAMS)


class Budget:
    """A token bucket: `burst` tokens, refilled at `rate` a second; `spend` takes one, False when
    none is left."""

    __slots__ = ("burst", "rate", "tokens", "stamp")

    def __init__(self, burst: int, rate: float, now: float):
        self.burst, self.rate, self.tokens, self.stamp = burst, rate, float(burst), now

    def spend(self, now: float) -> bool:
        tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now
        if tokens < 1:
            self.tokens = tokens
            return False
        self.tokens = tokens - 1
        return True

    def earn(self, n: int) -> None:
        if self.tokens < self.burst:
            self.tokens = min(self.burst, self.tokens + n)


@dataclass(frozen=True)
class Keepalive:
    """A connection's timing policy, in seconds, from Triton's gRPC keepalive flags: the server
    PINGs a connection `time` after it last heard from it (only while calls are open unless
    `without_calls`) and closes it when no ACK comes within `timeout`; a connection older than
    `max_age` is sent GOAWAY and closed after `max_age_grace` more (0: never). Also the deadlines
    for what a client has started to send, and the policy for the client's own PINGs (see
    Connection._ping_policy)."""

    time: float = 7200.0
    timeout: float = 20.0
    without_calls: bool = False
    max_age: float = 0.0
    max_age_grace: float = 0.0
    preface_timeout: float = 10.0  # a new connection must open with HTTP/2's preface within this (0: no limit)
    # a frame other than DATA, once begun, must be complete within preface_timeout too; a DATA frame within
    # data_timeout (0: no limit); both count from the read after the frame before it completed
    data_timeout: float = 60.0
    # Triton's --grpc-http2-min-recv-ping-interval-without-data (s) and --grpc-http2-max-ping-strikes: a client
    # PING sooner than that after the last while no call is open is a strike; past the strikes, GOAWAY
    min_ping_interval: float = 300.0
    max_ping_strikes: int = 2

    @classmethod
    def from_triton_ms(cls, time_ms: float, timeout_ms: float, permit_without_calls: bool, max_age_ms: float,
                       max_age_grace_ms: float, min_recv_ping_interval_ms: float, max_ping_strikes: int,
                       preface_timeout: float, data_timeout: float = 60.0) -> Keepalive:
        """From Triton's gRPC keepalive settings, which count milliseconds (its flags and the
        tritonfrontend Options alike)."""
        return cls(time_ms / 1000, timeout_ms / 1000, permit_without_calls, max_age_ms / 1000, max_age_grace_ms / 1000,
                   preface_timeout, data_timeout, min_recv_ping_interval_ms / 1000, max_ping_strikes)


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
        # from connection_made, before anything reads them: the serving loop, the transport, the budgets
        self.loop: asyncio.AbstractEventLoop
        self.transport: asyncio.Transport
        self.resets: Budget  # of streams reset by the client or refused
        self.control: Budget  # of frames that carry no request
        self.heard = 0.0  # when the client last sent anything (loop time)
        self.last_ping = float("-inf")  # when the client last sent a PING with no call open
        self.ping_strikes = 0
        self.buffer = bytearray()
        self.preface_seen = False
        self.decoder = hpack.Decoder()
        self.decoder.max_header_list_size = HEADER_LIST_HARD
        self.header_cache: dict[bytes, tuple[dict[bytes, bytes], int]] = {}
        self.streams: dict[int, Stream] = {}
        self.last_stream_id = 0
        self.peer_frame_size = DEFAULT_FRAME_SIZE
        self.peer_initial_window = DEFAULT_WINDOW
        self.send_window = DEFAULT_WINDOW
        self.recv_unacked = 0
        self.continuing: list | None = None  # a header block still open (see _headers)
        self.backlog = False  # input left for the next turn of the loop
        self.held = False  # reading paused for that backlog
        self.frames_done = 0  # frames completed so far
        self.stall_mark = -1  # frames_done when the stall deadline was set
        self.stall_at: float | None = None  # when the frame in progress must be complete
        self.goaway_sent = False
        self.closed = False
        self.window_waiters: list[asyncio.Future] = []
        self.drained: asyncio.Future | None = None
        self.write_paused = False
        self.resume_waiters: list[asyncio.Future] = []
        self.pending: list[bytes] = []  # frames written in this loop iteration, sent together at its end
        self.data_left = 0  # bytes still to come of a DATA frame whose payload is handed on as it arrives
        self.pad_left = 0  # and of its padding, dropped
        self.data_stream: Stream | None = None  # that frame's stream (None: its payload is dropped)
        self.data_flags = 0
        self.direct: memoryview | None = None  # the handler's buffer the next read goes into, if any
        self.lingering = 0  # bytes still to drop in a lingering close

    def _write(self, data: bytes) -> None:
        """Frames go out once per loop iteration: the answers that complete together (a batch)
        leave in one system call."""
        if self.closed:
            return
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
            (SETTINGS_MAX_FRAME_SIZE, RECV_FRAME_SIZE), (SETTINGS_MAX_HEADER_LIST_SIZE, HEADER_LIST_SOFT),
            (SETTINGS_MAX_CONCURRENT_STREAMS, MAX_STREAMS)))
        transport.write(frame(SETTINGS, 0, 0, settings)
                        + frame(WINDOW_UPDATE, 0, 0, _U32.pack(RECV_CONNECTION_WINDOW - DEFAULT_WINDOW)))
        loop = self.loop
        self.heard = loop.time()
        self.resets = Budget(*RESET_BUDGET, self.heard)
        self.control = Budget(*CONTROL_BUDGET, self.heard)
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
        assert stream is not None  # its handler offered the buffer (get_buffer)
        try:
            cast(DirectReceiver, stream.handler).received_into(nbytes)
            if not self.data_left and not self.closed:
                self.data_stream = None
                self.frames_done += 1
                self._data_end(stream, self.data_flags)
        except Exception:  # a bug of ours: this connection ends, the server serves on
            log.exception("HTTP/2 connection failed")
            self._goaway(INTERNAL_ERROR)
            self._close()
        self._watch_stall()

    def data_received(self, data) -> None:
        """Bytes read from the client (a view valid during the call)."""
        if self.closed:
            if self.lingering:  # dropped, up to a bound
                self.lingering -= len(data)
                if self.lingering <= 0:
                    self.lingering = 0
                    self.transport.close()
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
            if self.pad_left:  # and its padding
                n = min(self.pad_left, view.nbytes)
                self.pad_left -= n
                view = view[n:]
                if not view.nbytes:
                    return
            buf = self.buffer
            if not buf:  # frames are read in place; an incomplete one (or the rest of the turn's) is kept
                used = self._frames(view)
                if used < view.nbytes and not self.closed:
                    buf += view[used:]
            else:
                buf += view
                if not self.backlog:  # else the next turn handles it
                    with memoryview(buf) as held:
                        used = self._frames(held)
                    if not self.closed:
                        del buf[:used]
        except Exception as e:  # noqa: BLE001 - every error ends this connection alone
            self._failed(e)
        finally:
            self._watch_stall()

    def _failed(self, error: Exception) -> None:
        """End the connection on an error of the client's (GOAWAY with its code), or a bug of ours
        (logged, INTERNAL_ERROR): the server serves on."""
        if isinstance(error, ProtocolError):
            log.debug("HTTP/2 connection error: %s", error)
            self._goaway(error.code, str(error).encode())
        elif isinstance(error, hpack.HPACKError):
            self._goaway(COMPRESSION_ERROR, str(error).encode())
        else:
            log.error("HTTP/2 connection failed", exc_info=error)
            self._goaway(INTERNAL_ERROR)
        self._close(linger=True)

    # ---- bounds on what one connection's input costs ----

    def _yield_turn(self) -> None:
        """The turn's time is up with input left: reading pauses, and the rest is handled in the
        next turn of the loop, after the other connections have had theirs."""
        if not self.backlog:
            self.backlog = True
            self.loop.call_soon(self._next_turn)
            if not self.held:
                self.held = True
                self.transport.pause_reading()

    def _next_turn(self) -> None:
        self.backlog = False
        if self.closed:
            return
        buf = self.buffer
        try:
            with memoryview(buf) as held:
                used = self._frames(held)
            if not self.closed:
                del buf[:used]
        except Exception as e:  # noqa: BLE001
            self._failed(e)
        self._watch_stall()
        if not self.backlog and self.held and not self.closed:
            self.held = False
            if not self.write_paused:
                self.transport.resume_reading()

    def _watch_stall(self) -> None:
        """Once input stops in the middle of a frame, the frame must be complete by a deadline
        (Keepalive.preface_timeout for frames other than DATA, data_timeout for DATA), counted from
        the first read after the frame before it: a client cannot hold a partial frame, or the
        memory it takes, for longer. A header block counts as one frame, however many CONTINUATION
        frames it takes."""
        if self.closed:
            return
        continuing = self.continuing
        if not (self.data_left or self.pad_left or self.buffer or continuing is not None) or self.backlog:
            self.stall_at = None
            return
        progress = self.frames_done if continuing is None else continuing[5]
        if self.stall_at is not None and self.stall_mark == progress:
            return
        limit = self.keepalive.data_timeout if self.data_left or self.pad_left else self.keepalive.preface_timeout
        if limit <= 0:
            self.stall_at = None
            return
        self.stall_mark = progress
        self.stall_at = self.heard + limit
        timer = self.timers.get("stall")
        if timer is not None and timer.when() > self.stall_at:  # it would fire too late: made again
            timer.cancel()
            timer = None
        if timer is None:
            self.timers["stall"] = self.loop.call_at(self.stall_at, self._stalled)

    def _stalled(self) -> None:
        self.timers.pop("stall", None)
        if self.stall_at is None or self.closed:
            return
        if self.loop.time() < self.stall_at:
            self.timers["stall"] = self.loop.call_at(self.stall_at, self._stalled)
            return
        log.info("closing a gRPC connection whose client left a frame unfinished for %gs",
                 self.keepalive.data_timeout if self.data_left or self.pad_left else self.keepalive.preface_timeout)
        self._goaway(PROTOCOL_ERROR, b"frame not completed in time")
        for stream in list(self.streams.values()):
            self._drop(stream, notify=True)
        self._close(linger=True)

    def _calm_control(self) -> None:
        """A frame that carries no request: spent from the connection's control budget."""
        if not self.control.spend(self.heard):
            raise ProtocolError("too many control frames", ENHANCE_YOUR_CALM)

    def _calm_reset(self) -> None:
        """A stream reset by the client, or refused: spent from the connection's reset budget."""
        if not self.resets.spend(self.heard):
            raise ProtocolError("too many streams reset", ENHANCE_YOUR_CALM)

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
        turn_ends = time.perf_counter() + TURN_SECONDS
        while end - pos >= 9:
            length = view[pos] << 16 | view[pos + 1] << 8 | view[pos + 2]
            kind = view[pos + 3]
            if length > RECV_FRAME_SIZE or (length > MAX_CONTROL_FRAME and kind != DATA):
                raise ProtocolError(f"frame of {length} bytes exceeds the maximum frame size", FRAME_SIZE_ERROR)
            flags = view[pos + 4]
            stream_id = _U32.unpack_from(view, pos + 5)[0] & 0x7FFFFFFF
            if end - pos < 9 + length:
                if kind != DATA or (flags & FLAG_PADDED and end - pos < 10):
                    break
                # a large DATA frame: its payload goes on in pieces, not gathered here first
                start = pos + 9
                pad = 0
                if flags & FLAG_PADDED:
                    pad = view[start]
                    start += 1
                    if pad >= length:
                        raise ProtocolError("padding exceeds the frame")
                content = length - 1 - pad if flags & FLAG_PADDED else length
                self.data_stream = self._data_start(flags, stream_id, length)
                self.data_flags = flags
                self.data_left = content
                self.pad_left = pad
                arrived = end - start
                self._data_part(view[start:start + min(arrived, content)])
                if arrived > content:
                    self.pad_left -= arrived - content
                return end
            payload = view[pos + 9:pos + 9 + length]
            pos += 9 + length
            self.frames_done += 1
            if kind == DATA:
                self._data(flags, stream_id, payload)
            else:
                self._frame(kind, flags, stream_id, bytes(payload))
            if self.closed:
                break
            if time.perf_counter() > turn_ends and end - pos >= 9:
                self._yield_turn()
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
        if self.transport is not None and not self.closed and not self.held:
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
            self._calm_control()
            self._window_update(stream_id, payload)
        elif kind == PING:
            if stream_id or len(payload) != 8:
                raise ProtocolError("malformed PING", FRAME_SIZE_ERROR if len(payload) != 8 else PROTOCOL_ERROR)
            self._calm_control()
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
            if stream_id > self.last_stream_id:
                raise ProtocolError("RST_STREAM on an idle stream")
            # counted whether or not the stream is still open here: a client that resets streams as fast
            # as it opens them is sending requests it does not want answered
            self._calm_reset()
            stream = self.streams.get(stream_id)
            if stream is not None:
                self._drop(stream, notify=True)
        elif kind == GOAWAY:
            if stream_id:
                raise ProtocolError("GOAWAY on a stream")
            self._goaway(NO_ERROR)
            self._close_when_idle()
        elif kind == PRIORITY:
            if not stream_id or len(payload) != 5:
                raise ProtocolError("malformed PRIORITY")
            self._calm_control()
        elif kind == PUSH_PROMISE:
            raise ProtocolError("a client may not push")
        else:  # unknown frame types are ignored (RFC 9113 5.5)
            self._calm_control()

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
                self._close(linger=True)
                return
        if not self.streams:
            self.last_ping = now

    def _answered(self) -> None:
        """Headers or data are being sent: the client's PINGs are forgiven, and its control frames
        (window updates, PINGs measuring the bandwidth) earn budget."""
        self.ping_strikes = 0
        self.last_ping = float("-inf")
        self.control.earn(CONTROL_EARNED)

    def _strip_padding(self, flags: int, payload: Payload) -> Payload:
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
            assert stream.handler is not None, "a stream has its handler once its headers are in"
            stream.handler.data(chunk)
        elif not flags & FLAG_END_STREAM:
            self._calm_control()
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
            if not self.data_left:
                self.frames_done += 1
            return
        if chunk.nbytes:
            assert stream.handler is not None, "a stream has its handler once its headers are in"
            stream.handler.data(chunk)
        if not self.data_left:
            self.data_stream = None
            self.frames_done += 1
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
                stream = _REFUSED if refuse else Stream(stream_id)
        elif stream.remote_closed:
            raise ProtocolError("HEADERS on a half-closed stream", STREAM_CLOSED)
        if flags & FLAG_END_HEADERS:
            self._header_block(stream, stream_id, flags, payload)
        else:
            # the stream, its id, the first frame's flags, the block so far, its CONTINUATION frames, and
            # frames_done when it began (its deadline counts from there: _watch_stall)
            self.continuing = [stream, stream_id, flags, bytearray(payload), 0, self.frames_done]

    def _continuation(self, flags: int, stream_id: int, payload: bytes) -> None:
        continuing = self.continuing
        if continuing is None or continuing[1] != stream_id:
            raise ProtocolError("unexpected CONTINUATION frame")
        stream, _, first_flags, block, frames, _ = continuing
        block += payload
        if len(block) > HEADER_LIST_HARD:
            raise ProtocolError("header block too large", ENHANCE_YOUR_CALM)
        continuing[4] = frames = frames + 1
        if flags & FLAG_END_HEADERS:
            self.continuing = None
            self._header_block(stream, stream_id, first_flags, bytes(block))
        elif frames >= MAX_CONTINUATIONS:
            raise ProtocolError("too many CONTINUATION frames", ENHANCE_YOUR_CALM)

    def _decode(self, block: bytes) -> tuple[dict[bytes, bytes], int]:
        """A header block as a dict, and the header list's size. Clients repeat the same headers on
        every call, which after the first call are references into the dynamic table, so their blocks
        repeat byte for byte: such a block only reads the table, and its decoding is kept until the
        table changes. The decoder stops past HEADER_LIST_HARD (an HPACKError)."""
        decoded = self.header_cache.get(block)
        if decoded is None:
            fields = self.decoder.decode(block, raw=True)
            decoded = dict(fields), sum(len(name) + len(value) + 32 for name, value in fields)
            if _only_indexed(block):
                if len(self.header_cache) >= 64:
                    self.header_cache.clear()
                self.header_cache[block] = decoded
            else:  # the block may have added to or resized the table: earlier decodings are stale
                self.header_cache.clear()
        return decoded

    def _header_block(self, stream: Stream, stream_id: int, flags: int, block: bytes) -> None:
        headers, size = self._decode(block)
        if stream is _CLOSED:
            return
        if stream is _REFUSED:  # after GOAWAY: the client may retry it elsewhere
            self._calm_reset()
            self._reset(stream_id, REFUSED_STREAM)
            return
        if size > HEADER_LIST_SOFT:  # the application refuses it (Stream.header_size), and it counts as a reset
            self._calm_reset()
        end_stream = bool(flags & FLAG_END_STREAM)
        if stream.handler is not None:  # trailers
            if not end_stream:
                raise ProtocolError("trailers without END_STREAM")
            stream.remote_closed = True
            stream.handler.end()
            return
        stream.headers = headers  # shared with the decoding cache: read, never changed
        stream.header_size = size
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
        if len(payload) > 6 * MAX_SETTINGS_ENTRIES:
            raise ProtocolError("too many SETTINGS entries", ENHANCE_YOUR_CALM)
        self._calm_control()
        window = self.peer_initial_window
        for pos in range(0, len(payload), 6):
            key, value = _SETTING.unpack_from(payload, pos)
            if key == SETTINGS_INITIAL_WINDOW_SIZE:
                if value > MAX_WINDOW:
                    raise ProtocolError("initial window too large", FLOW_CONTROL_ERROR)
                window = value
            elif key == SETTINGS_MAX_FRAME_SIZE:
                if not DEFAULT_FRAME_SIZE <= value <= (1 << 24) - 1:
                    raise ProtocolError("invalid SETTINGS_MAX_FRAME_SIZE")
                self.peer_frame_size = value
            elif key == SETTINGS_ENABLE_PUSH and value > 1:
                raise ProtocolError("invalid SETTINGS_ENABLE_PUSH")
        if window != self.peer_initial_window:  # every stream's window moves with it (Stream.window)
            grew = window > self.peer_initial_window
            self.peer_initial_window = window
            if grew:
                self._wake_windows()
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
            stream.window += increment
            if self.peer_initial_window + stream.window > MAX_WINDOW:
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
        if n > self.send_window or n > self.peer_initial_window + stream.window or n > self.peer_frame_size \
                or self.write_paused:
            return False
        if not self.is_open(stream):
            return True
        self.send_window -= n
        stream.window -= n
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
            n = min(view.nbytes, self.send_window, self.peer_initial_window + stream.window, self.peer_frame_size)
            if n <= 0:
                waiter = loop.create_future()
                self.window_waiters.append(waiter)
                await waiter
                continue
            self.send_window -= n
            stream.window -= n
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

    def _close(self, linger: bool = False) -> None:
        """Close the connection after what is pending is written. `linger`, for a connection ended on
        an error: it is shut for writing and what the client still sends is read and dropped, for
        LINGER_SECONDS and LINGER_BYTES at most, before it closes; closed with unread input, the
        kernel would reset it, and the client could lose the GOAWAY that says why."""
        if self.closed:
            return
        self.closed = True
        self._flush()
        transport = self.transport
        if not linger or not transport.can_write_eof():  # TLS cannot half-close
            transport.close()
            return
        transport.write_eof()
        self.lingering = LINGER_BYTES
        self.timers["linger"] = self.loop.call_later(LINGER_SECONDS, transport.close)
        self.held = False
        transport.resume_reading()

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
