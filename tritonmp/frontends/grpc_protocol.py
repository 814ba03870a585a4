"""gRPC over this server's own HTTP/2 connections (`http2.Connection`): method dispatch, the
length-prefixed message framing, compressed requests (gzip, deflate), deadlines (`grpc-timeout`),
and status trailers. Unary-unary and bidirectional-streaming methods, which are all that
Triton's service has.

Handlers are plain coroutines: `async def f(request) -> response` for unary methods, and
`async def f(requests: AsyncIterator) -> AsyncIterator[response]` (an async generator) for
streaming ones. They fail with `RpcError`.
"""

from __future__ import annotations

import asyncio
import contextvars
import enum
import ssl
import sys
import zlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, cast

from ..ipc.buffers import RECEIVE_POOL
from ..logs import get_logger
from . import http2
from .grpc_compression import ACCEPT_ENCODING, ENCODED_HEADERS, frame, response_encoding
from .inflate import TooLarge, inflate
from .protobuf_framing import NotAMessage, ProtobufFraming, TooLong

log = get_logger("grpc")


class Code(enum.IntEnum):
    OK = 0
    CANCELLED = 1
    UNKNOWN = 2
    INVALID_ARGUMENT = 3
    DEADLINE_EXCEEDED = 4
    NOT_FOUND = 5
    ALREADY_EXISTS = 6
    PERMISSION_DENIED = 7
    RESOURCE_EXHAUSTED = 8
    FAILED_PRECONDITION = 9
    ABORTED = 10
    OUT_OF_RANGE = 11
    UNIMPLEMENTED = 12
    INTERNAL = 13
    UNAVAILABLE = 14
    DATA_LOSS = 15
    UNAUTHENTICATED = 16


class RpcError(Exception):
    def __init__(self, code: Code, message: str):
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass(frozen=True)
class Method:
    request_type: Any  # a protobuf message class
    handler: Callable[..., Any]  # a coroutine function; for a streaming method, an async generator function
    streaming: bool = False
    # how a request message's bytes become what the handler takes (default: request_type.FromString)
    parse: Callable | None = None
    # a unary method's handler in two halves, for calls answered without a task: `start(request)`
    # returns a future, `finish(future)` the response once it is done; both fail with RpcError
    start: Callable[..., asyncio.Future] | None = None
    finish: Callable | None = None
    compressible: bool = False  # its responses are compressed at --grpc-infer-response-compression-level


RESPONSE_HEADERS = http2.header_block([(b":status", b"200"), (b"content-type", b"application/grpc"),
                                       (b"grpc-accept-encoding", ACCEPT_ENCODING)])
OK_TRAILERS = http2.header_block([(b"grpc-status", b"0")])
_END = object()
_TIMEOUT_UNITS = {b"H": 3600.0, b"M": 60.0, b"S": 1.0, b"m": 1e-3, b"u": 1e-6, b"n": 1e-9}


def _percent_encode(message: str) -> bytes:
    out = bytearray()
    for b in message.encode("utf-8", "replace"):
        out += b"%%%02X" % b if b < 0x20 or b > 0x7E or b == 0x25 else bytes((b,))
    return bytes(out)


def status_block(code: Code, message: str = "", trailers_only: bool = False) -> bytes:
    """The header block that ends a call with a status: trailers after a response's headers, or a
    whole trailers-only response when nothing was sent before."""
    headers = [(b":status", b"200"), (b"content-type", b"application/grpc")] if trailers_only else []
    headers.append((b"grpc-status", str(int(code)).encode()))
    if message:
        headers.append((b"grpc-message", _percent_encode(message)))
    return http2.header_block(headers)


def _deadline(value: bytes | None) -> float | None:
    """Seconds from a `grpc-timeout` header (an integer and a unit), None when absent or invalid."""
    if not value or len(value) < 2 or not value[:-1].isdigit() or value[-1:] not in _TIMEOUT_UNITS:
        return None
    return int(value[:-1]) * _TIMEOUT_UNITS[value[-1:]]


# the request metadata of the call being served, for handlers that read it (a stream's error mode)
CALL_METADATA: contextvars.ContextVar = contextvars.ContextVar("grpc_call_metadata", default=())


def metadata_items():
    """The request metadata of the current call, (key, value) pairs, whatever the engine."""
    metadata = CALL_METADATA.get()
    return metadata.items() if isinstance(metadata, dict) else metadata


def metadata_value(name: str) -> str:
    """A request metadata value of the current call ("" when absent), whatever the engine."""
    metadata = CALL_METADATA.get()
    items = metadata.items() if isinstance(metadata, dict) else metadata
    for key, value in items:
        key = key.decode("latin-1") if isinstance(key, bytes) else key
        if key.lower() == name:
            return value.decode("latin-1") if isinstance(value, bytes) else str(value)
    return ""


class _Compressed:
    """A compressed request message, not inflated yet."""

    __slots__ = ("payload",)

    def __init__(self, payload: bytes):
        self.payload = payload


LARGE_MESSAGE = 64 * 1024  # a message this large is received into a buffer of its declared size


class _Call(http2.StreamHandler):
    """One RPC on one HTTP/2 stream."""

    __slots__ = ("conn", "stream", "method", "head", "body", "filled", "compressed", "received", "messages", "task",
                 "encoding", "timeout", "headers_sent", "max_message", "refused", "future", "response_encoding",
                 "response_headers")

    def __init__(self, conn: http2.Connection, stream: http2.Stream, method: Method, max_message: int = (1 << 31) - 1,
                 compression: str = "none"):
        self.max_message = max_message
        self.refused = False  # a message over the limit was announced: the rest of the call is dropped
        self.conn = conn
        self.stream = stream
        self.method = method
        self.head = bytearray()  # the 5-byte prefix of the next message, as far as it has come
        self.body: memoryview | None = None  # the message being received, of its declared length
        self.filled = 0  # how much of it has come
        self.compressed = 0
        self.received: list = []  # a unary call's messages, parsed at its end
        self.messages: asyncio.Queue | None = None
        self.task: asyncio.Task | None = None
        self.future: asyncio.Future | None = None  # a call answered from its done-callback
        self.encoding = stream.headers.get(b"grpc-encoding", b"identity")
        self.response_encoding = response_encoding(compression, stream.headers.get(b"grpc-accept-encoding", b"")) \
            if method.compressible else b""
        self.response_headers = ENCODED_HEADERS[self.response_encoding] if self.response_encoding \
            else RESPONSE_HEADERS
        self.timeout = _deadline(stream.headers.get(b"grpc-timeout"))
        self.headers_sent = False
        if method.streaming:
            self.messages = asyncio.Queue()
            self.task = conn.loop.create_task(self._run(self._streaming))

    # ---- from the connection ----

    def data(self, chunk: memoryview) -> None:
        """Messages are cut from the stream as it comes: each is copied once, from the
        connection's receive buffer into one buffer of the length its prefix declares."""
        view = chunk
        while view.nbytes and not self.refused:
            body = self.body
            if body is not None:
                n = min(view.nbytes, body.nbytes - self.filled)
                body[self.filled:self.filled + n] = view[:n]
                self.filled += n
                view = view[n:]
                if self.filled == body.nbytes:
                    self.body = None
                    self._received(body)
                continue
            head = self.head
            if len(head) < 5:
                take = 5 - len(head)
                head += view[:take]
                view = view[take:]
                if len(head) < 5:
                    return
            length = int.from_bytes(head[1:5], "big")
            self.compressed = head[0]
            head.clear()
            if length > self.max_message:  # refused before its bytes are buffered
                self._refuse(f"Received message larger than max ({length} vs. {self.max_message})")
                return
            if length <= view.nbytes and length < LARGE_MESSAGE:
                self._received(view[:length].tobytes())
                view = view[length:]
                continue
            try:
                self.body = RECEIVE_POOL.take(length) if length >= LARGE_MESSAGE else memoryview(bytearray(length))
            except MemoryError:
                self._refuse(f"no memory for a message of {length} bytes")
                return
            self.filled = 0

    def receive_into(self, limit: int) -> memoryview | None:
        """The empty part of the message being gathered (at most `limit` bytes), for the connection
        to read the rest of a DATA payload into."""
        body = self.body
        if body is None or self.refused:
            return None
        return body[self.filled:self.filled + min(limit, body.nbytes - self.filled)]

    def received_into(self, n: int) -> None:
        body = self.body
        assert body is not None, "the connection reads into the buffer receive_into gave it"
        self.filled += n
        if self.filled == body.nbytes:
            self.body = None
            self._received(body)

    def _refuse(self, message: str) -> None:
        """End the call with RESOURCE_EXHAUSTED and drop whatever else it sends."""
        self.refused = True
        self.body = None
        if self.task is not None:
            self.task.cancel()
        self._fail(Code.RESOURCE_EXHAUSTED, message)
        self.conn.reset_stream(self.stream, http2.NO_ERROR)

    def _received(self, payload) -> None:
        """A whole message: queued for a streaming call (parsed now, or inflated later by the call's
        own task), kept until the end for a unary one."""
        item = _Compressed(payload) if self.compressed else payload
        if self.messages is None:
            self.received.append(item if not self.received else None)  # only the first is kept
            return
        try:
            self.messages.put_nowait(item if self.compressed else self._parse(payload))
        except RpcError as e:
            self.messages.put_nowait(e)

    def end(self) -> None:
        if self.refused:
            return
        if self.messages is not None:
            self.messages.put_nowait(_END)
            return
        try:
            if self.body is not None or self.head:
                raise RpcError(Code.INTERNAL, "the request ended inside a message")
            if len(self.received) != 1:
                raise RpcError(Code.INTERNAL, f"a unary method takes one request message, got {len(self.received)}")
            item = self.received[0]
            self.received = []  # the call's task holds the message from here; nothing else may
            request = item if isinstance(item, _Compressed) else self._parse(item)
        except RpcError as e:
            self._fail(e.code, e.message)
            return
        if self.method.start is not None and self.timeout is None and not isinstance(request, _Compressed):
            self._start(request)
        else:
            self.task = self.conn.loop.create_task(self._run(self._unary, request))

    def reset(self) -> None:
        if self.task is not None:
            self.task.cancel()
        if self.future is not None:
            self.future.cancel()

    # ---- a unary call without a task ----

    def _start(self, request) -> None:
        start = self.method.start
        assert start is not None  # end() starts only a method that has its two halves
        try:
            self.future = start(request)
        except Exception as e:  # noqa: BLE001 - the call's status
            self._failed(e)
            return
        self.future.add_done_callback(self._finished)

    def _finished(self, future: asyncio.Future) -> None:
        self.future = None
        if future.cancelled():
            return  # the client reset the stream or went away: nobody to answer
        finish = self.method.finish
        assert finish is not None  # a method with start has finish
        try:
            message = finish(future)
            if self.response_encoding:  # compressed off the loop
                self.task = self.conn.loop.create_task(self._run(self._send_message, message))
                return
            data = self._frame(message)
        except Exception as e:  # noqa: BLE001
            self._failed(e)
            return
        if not self._send_now(data):
            self.task = self.conn.loop.create_task(self._run(self._send_rest, data))

    async def _send_message(self, message) -> None:
        data = await self._encoded(message)
        if not self._send_now(data):
            await self._send_rest(data)

    def _failed(self, error: BaseException) -> None:
        """End the call with the status of what it failed with: an RpcError's own, or INTERNAL (logged)."""
        if isinstance(error, RpcError):
            self._fail(error.code, error.message)
            return
        log.error("gRPC call %s failed", self.stream.headers.get(b":path", b"").decode(errors="replace"),
                  exc_info=error)
        self._fail(Code.INTERNAL, f"internal error: {type(error).__name__}: {error}")

    # ---- messages ----

    async def _message(self, item):
        """A request message: parsed already, or inflated (bounded, in slices) and parsed now."""
        if not isinstance(item, _Compressed):
            return item
        encoding = self.encoding.decode(errors="replace")
        framing = ProtobufFraming(self.max_message)  # a bomb of what cannot be a message stops at its start
        try:
            return self._parse(await inflate(item.payload, encoding, self.max_message, framing.feed))
        except NotAMessage:
            raise RpcError(Code.INTERNAL, "Unable to parse request") from None
        except (TooLarge, TooLong) as e:
            raise RpcError(Code.RESOURCE_EXHAUSTED, f"Received message larger than max ({e.args[0]} vs. "
                                                    f"{self.max_message}) once decompressed") from None
        except ValueError:
            raise RpcError(Code.UNIMPLEMENTED, f"compressed message with unsupported grpc-encoding '{encoding}'") \
                from None
        except zlib.error as e:
            raise RpcError(Code.INTERNAL, f"could not decompress the request: {e}") from None

    def _parse(self, payload):
        try:
            return (self.method.parse or self.method.request_type.FromString)(payload)
        except Exception:
            raise RpcError(Code.INTERNAL, "Unable to parse request") from None

    # ---- answering ----

    def _fail(self, code: Code, message: str) -> None:
        self.conn.send_headers(self.stream, status_block(code, message, trailers_only=not self.headers_sent),
                               end_stream=True)

    def _frame(self, message) -> bytes | list:
        return frame(message, self.response_encoding)

    async def _encoded(self, message) -> bytes | list:
        """`_frame`, compressing on a thread of its own."""
        return await asyncio.to_thread(self._frame, message) if self.response_encoding else self._frame(message)

    async def _send(self, data: bytes | list) -> None:
        conn, stream = self.conn, self.stream
        for part in data if isinstance(data, list) else (data,):
            await conn.send_data(stream, part)

    async def _run(self, work, *args) -> None:
        """`await work(*args)` under the call's deadline; any failure becomes the call's status.
        (The coroutine is made here, so a call cancelled before it starts leaves none unawaited.)"""
        try:
            if self.timeout is None:
                await work(*args)
            elif sys.version_info >= (3, 11):
                async with asyncio.timeout(self.timeout):
                    await work(*args)
            else:  # Python 3.10 has no asyncio.timeout
                await asyncio.wait_for(work(*args), self.timeout)
        except (TimeoutError, asyncio.TimeoutError):
            self._fail(Code.DEADLINE_EXCEEDED, "Deadline Exceeded")
        except asyncio.CancelledError:
            pass  # the client reset the stream or went away: nobody to answer
        except Exception as e:  # RpcError too
            self._failed(e)

    async def _unary(self, request) -> None:
        CALL_METADATA.set(self.stream.headers)  # in the call's own task
        data = await self._encoded(await cast(Awaitable, self.method.handler(await self._message(request))))
        if not self._send_now(data):
            await self._send_rest(data)

    def _send_now(self, data: bytes | list) -> bool:
        """Send the whole response, headers to trailers, if the flow-control windows take it now."""
        return not isinstance(data, list) and self.conn.try_send_all(self.stream, self.response_headers, data,
                                                                      OK_TRAILERS)

    async def _send_rest(self, data: bytes | list) -> None:
        """Send the response as the windows open."""
        conn, stream = self.conn, self.stream
        conn.send_headers(stream, self.response_headers)
        self.headers_sent = True
        await self._send(data)
        conn.send_headers(stream, OK_TRAILERS, end_stream=True)

    async def _requests(self):
        messages = self.messages
        assert messages is not None, "a streaming call queues its messages"
        while True:
            item = await messages.get()
            if item is _END:
                return
            if isinstance(item, RpcError):
                raise item
            yield await self._message(item)

    async def _streaming(self) -> None:
        conn, stream = self.conn, self.stream
        CALL_METADATA.set(stream.headers)
        async for response in self.method.handler(self._requests()):
            if not self.headers_sent:
                conn.send_headers(stream, self.response_headers)
                self.headers_sent = True
            await self._send(await self._encoded(response))
        if self.headers_sent:
            conn.send_headers(stream, OK_TRAILERS, end_stream=True)
        else:
            self._fail(Code.OK, "")


class GrpcServer:
    """Serves `methods` (full paths such as `/inference.GRPCInferenceService/ModelInfer`)."""

    def __init__(self, methods: dict[str, Method], keepalive: http2.Keepalive | None = None, guard=None,
                 max_message: int = (1 << 31) - 1, max_connections: int = 0, compression: str = "none"):
        """`guard(path, headers)` may refuse a call before it runs: it returns None, or the
        RpcError to end the call with. `max_message`: the largest request message, as received
        and as inflated."""
        self.methods = {path.encode(): m for path, m in methods.items()}
        self.keepalive = keepalive
        self.guard = guard
        self.max_message = max_message
        self.max_connections = max_connections  # 0: no cap
        self.compression = compression  # --grpc-infer-response-compression-level
        self.connections: set[http2.Connection] = set()
        self.server: asyncio.AbstractServer | None = None

    def _open_stream(self, conn: http2.Connection, stream: http2.Stream) -> http2.StreamHandler:
        headers = stream.headers
        if stream.header_size > http2.HEADER_LIST_SOFT:
            message = (f"the request's metadata of {stream.header_size} bytes exceeds the limit of "
                       f"{http2.HEADER_LIST_SOFT}")
            conn.send_headers(stream, status_block(Code.RESOURCE_EXHAUSTED, message, trailers_only=True),
                              end_stream=True)
            return _Ignored()
        method = self.methods.get(headers.get(b":path", b""))
        if headers.get(b":method") != b"POST" or not headers.get(b"content-type", b"").startswith(b"application/grpc"):
            conn.send_headers(stream, http2.header_block([(b":status", b"415")]), end_stream=True)
            return _Ignored()
        if method is None:
            path = headers.get(b":path", b"").decode(errors="replace")
            conn.send_headers(stream, status_block(Code.UNIMPLEMENTED, f"Method not found: {path}", trailers_only=True),
                              end_stream=True)
            return _Ignored()
        refusal = self.guard(headers[b":path"].decode(), headers.items()) if self.guard is not None else None
        if refusal is not None:
            conn.send_headers(stream, status_block(refusal.code, refusal.message, trailers_only=True), end_stream=True)
            return _Ignored()
        return _Call(conn, stream, method, self.max_message, self.compression)

    def _connection(self) -> http2.Connection:
        refuse = bool(self.max_connections) and len(self.connections) >= self.max_connections
        if refuse:
            log.warning("refusing a gRPC connection: %d are open, the limit is %d", len(self.connections),
                        self.max_connections)
        conn = http2.Connection(self._open_stream, on_close=self.connections.discard, keepalive=self.keepalive,
                                refuse=refuse)
        if not refuse:
            self.connections.add(conn)
        return conn

    async def start(self, host: str, port: int, ssl_context: ssl.SSLContext | None = None) -> None:
        loop = asyncio.get_running_loop()
        self.server = await loop.create_server(self._connection, host.strip("[]") or None, port,
                                               ssl=ssl_context, reuse_address=True)

    async def stop(self, grace: float | None) -> None:
        """Stop accepting, then let the calls in flight finish within `grace` seconds."""
        if self.server is not None:
            self.server.close()
        await asyncio.gather(*(conn.shutdown(grace) for conn in list(self.connections)))


class _Ignored(http2.StreamHandler):
    """A stream already answered: whatever else the client sends is dropped."""

    def data(self, chunk: memoryview) -> None:
        pass

    def end(self) -> None:
        pass

    def reset(self) -> None:
        pass


def server_ssl_context(server_cert: str, server_key: str, root_cert: str | None = None,
                       mutual: bool = False) -> ssl.SSLContext:
    """TLS for gRPC: HTTP/2 by ALPN; client certificates checked against `root_cert` (required
    with `mutual`, requested otherwise)."""
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(server_cert, server_key)
    ctx.set_alpn_protocols(["h2"])
    if root_cert:
        ctx.load_verify_locations(root_cert)
        ctx.verify_mode = ssl.CERT_REQUIRED if mutual else ssl.CERT_OPTIONAL
    return ctx
