"""uvicorn's HTTP/1.1 protocol with the limits a server on an open network needs, which uvicorn
lacks: a deadline for a request's headers (from the connection's first byte, or a keep-alive
request's first byte, so trickling them slowly does not help), a deadline for each piece of a
request body once it has started, and a cap on open connections per listener (connections past it
are closed at once, before they can use up the process's file descriptors). A request's head is
bounded before the parser gathers it: MAX_LINE for the request line and for each header, MAX_HEAD for
all of it (the parser is never fed more than that of one head), answered 414 or 431 and closed. The
keep-alive timeout between requests is uvicorn's own `timeout_keep_alive`. A connection closed after an answer while
its client is still sending the request's body (a 413) closes lingering: shut for writing, the rest
dropped as it comes, for a bounded time and size, so that the client reads the answer.

A large request body with a declared length within the listener's limit is received into one
buffer of that length (`ReceivedBody`, in the request's scope) instead of uvicorn's ASGI body
messages, which gather it 64 KiB at a time and copy it twice more on the way to the application.

What the connection writes in one turn of the event loop goes out in one system call
(`CoalescingTransport`): uvicorn writes a response's head and body apart. Those calls are made at
the end of the turn, for every connection together (`Outbox`): the answers of a batch then reach
their client in one burst, which wakes it once.

The infer route's common case skips ASGI (`FastInfer`): a `POST .../infer` whose small body has a
declared length and no coding is decoded when its last byte arrives, handed to the server API, and
answered from its future's done-callback, with no task, scope, ASGI messages or body copies for
it. Whatever else (chunked, compressed, large or `Expect: 100-continue` bodies, pipelined
requests, restricted APIs, a client that is not reading) takes uvicorn's ASGI cycle as before; both
paths answer the same. The keep-alive timeout between requests is one more deadline of the
connection's timer instead of a call_later per response. Reading from a connection stays paused
while requests it sent ahead wait their turn (`PipelineFlowControl`).
"""

from __future__ import annotations

import asyncio
import re
import resource
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import httptools
import orjson
from uvicorn.protocols.http.flow_control import FlowControl
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from ..errors import ServerError, unavailable
from ..ipc.buffers import RECEIVE_POOL
from ..logs import get_logger
from .header_forwarding import forwarded
from .http_headers import JSON_HEADERS, KeptHeaders, error_headers

if TYPE_CHECKING:
    from ..inference import InferRequest
    from .http_infer import InferEndpoint

log = get_logger("http")


@dataclass(frozen=True)
class Limits:
    header_timeout: float = 10.0  # seconds to send a request's headers
    body_timeout: float = 60.0  # seconds a started body may go without a byte
    keepalive_timeout: float = 5.0  # seconds an idle keep-alive connection stays open
    max_connections: int = 0  # open connections per listener; 0: half the file descriptors allowed


def default_max_connections() -> int:
    """Half the process's file-descriptor limit, leaving the rest for workers, shared memory and
    the other listeners."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return max(64, min(65536, soft // 2)) if soft != resource.RLIM_INFINITY else 32768


LARGE_BODY = 64 * 1024  # a body this large, of a declared length, is received into one buffer
BODY_KEY = "tritonmp.body"  # the request scope's key of its ReceivedBody
FORWARDED_KEY = "tritonmp.forwarded"  # the request scope's key of the headers that reach the model


class ReceivedBody:
    """A request body as it arrives, into one buffer of its declared length: `view` once `done`."""

    __slots__ = ("view", "filled")

    def __init__(self, length: int):
        self.view = RECEIVE_POOL.take(length)
        self.filled = 0

    def write(self, chunk: bytes) -> None:
        n = len(chunk)
        self.view[self.filled:self.filled + n] = chunk
        self.filled += n

    @property
    def done(self) -> bool:
        return self.filled == self.view.nbytes


def _declared_length(headers: list) -> int:
    """The Content-Length of a request without a transfer coding, else -1."""
    length = -1
    for key, value in headers:
        if key == b"content-length":
            length = int(value) if value.isdigit() else -1
        elif key == b"transfer-encoding":
            return -1
    return length


class Outbox:
    """The connections of one event loop with writes pending, sent at the end of the loop's turn,
    one after another. The responses of a batch finish in one turn; written together, the client
    that sleeps on them is woken once for all of them, not once each (on a virtual machine, the
    wake-up is most of what a small response's `send` costs)."""

    __slots__ = ("_queued",)  # no reference to the loop, which keys it weakly in _OUTBOXES

    def __init__(self):
        self._queued: list = []

    def add(self, transport: CoalescingTransport) -> None:
        if not self._queued:
            transport.loop.call_soon(self._send)
        self._queued.append(transport)

    def _send(self) -> None:
        queued, self._queued = self._queued, []
        for transport in queued:
            transport.flush()


_OUTBOXES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # event loop -> its Outbox


class CoalescingTransport:
    """A transport whose writes made in one turn of the event loop go out together, in one system
    call, at the end of the turn (its Outbox): a response's head and body (uvicorn writes them
    apart), and the responses of pipelined requests that finish together. Closing writes what is
    pending first; everything else is the transport's own (the methods called per request are bound
    once, not looked up each time)."""

    __slots__ = ("_transport", "loop", "_outbox", "_pending", "is_closing", "pause_reading", "resume_reading",
                 "get_write_buffer_size", "lingers")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop):
        self._transport = transport
        self.loop = loop
        outbox = _OUTBOXES.get(loop)
        if outbox is None:
            outbox = _OUTBOXES[loop] = Outbox()
        self._outbox = outbox
        self._pending: list = []
        self.is_closing = transport.is_closing
        self.pause_reading = transport.pause_reading
        self.resume_reading = transport.resume_reading
        self.get_write_buffer_size = transport.get_write_buffer_size
        # asked before a close: True when the protocol closes the connection itself, later
        self.lingers: Callable[[], bool] | None = None

    def write(self, data) -> None:
        if not self._pending:
            self._outbox.add(self)
        self._pending.append(data)

    def writelines(self, parts) -> None:
        if not self._pending:
            self._outbox.add(self)
        self._pending.extend(parts)

    def flush(self) -> None:
        pending, self._pending = self._pending, []
        if pending and not self._transport.is_closing():
            self._transport.writelines(pending)

    def close(self) -> None:
        self.flush()
        if self.lingers is None or not self.lingers():
            self._transport.close()

    def close_now(self) -> None:
        self.flush()
        self._transport.close()

    def write_eof(self) -> None:
        self.flush()
        self._transport.write_eof()

    def __getattr__(self, name: str):
        return getattr(self._transport, name)


class PipelineFlowControl(FlowControl):
    """uvicorn's flow control, except that reading stays paused while requests already read wait
    their turn. uvicorn resumes reading whenever a response completes and whenever an application
    reads its body, so a client that sends requests back to back and never reads its answers
    made the server read, parse and queue them without end (hundreds of MiB in seconds)."""

    def __init__(self, transport: asyncio.Transport, pipeline):
        super().__init__(transport)
        self._pipeline = pipeline

    def resume_reading(self) -> None:
        if not self._pipeline:
            super().resume_reading()


class _NoEvent:
    """The cycle's message event, which nothing waits on for a FastInfer."""

    @staticmethod
    def set() -> None:
        pass


class FastInfer:
    """One infer request answered without ASGI: the parts of uvicorn's request-response cycle that
    the protocol and the server look at (response_complete, disconnected, keep_alive), and the
    request's own."""

    __slots__ = ("protocol", "model", "version", "header_length", "accept_encoding", "keep_alive",
                 "trace_context", "body", "request", "binary_default", "response_complete", "disconnected")
    message_event = _NoEvent()

    def __init__(self, protocol: GuardedHttpProtocol, model: str, version: str, header_length: int | None,
                 accept_encoding: str, keep_alive: bool, trace_context: dict | None = None):
        self.protocol = protocol
        self.trace_context = trace_context  # the W3C trace context the client sent, if any
        self.model = model
        self.version = version
        self.header_length = header_length
        self.accept_encoding = accept_encoding
        self.keep_alive = keep_alive
        self.body: list = []
        self.request: InferRequest | None = None
        self.binary_default = False
        self.response_complete = False
        self.disconnected = False

    def start(self) -> None:
        """The body is complete: decode the request and queue it."""
        endpoint = self.protocol.fast_infer
        assert endpoint is not None  # a FastInfer is made only where there is one
        body = self.body[0] if len(self.body) == 1 else b"".join(self.body)
        self.body = []
        future: asyncio.Future
        try:
            mv = endpoint.model(self.model, self.version)
            if mv is None:  # not loaded yet (--load-on-demand): decoded once it is
                future = asyncio.ensure_future(self._after_load(endpoint, body))
            else:
                future = self._submit(endpoint, body, mv)
        except Exception as e:  # noqa: BLE001 - answered as the ASGI path answers it
            self._failed(e)
            return
        future.add_done_callback(self.finished)

    def _submit(self, endpoint, body, mv) -> asyncio.Future:
        request, self.binary_default = endpoint.decode(body, self.header_length, self.model, self.version, mv)
        request.cancellable = False  # nothing awaits it: its client's going is seen by the protocol
        request.trace_context = self.trace_context
        self.request = request
        return endpoint.submit(request, self.protocol.forwarded, mv)

    async def _after_load(self, endpoint, body):
        mv = await endpoint.loaded(self.model, self.version)
        return await self._submit(endpoint, body, mv)

    def finished(self, future: asyncio.Future) -> None:
        if future.cancelled():
            self._failed(unavailable("the request was cancelled"))
            return
        error = future.exception()
        if error is not None:
            self._failed(error)
            return
        protocol = self.protocol
        endpoint = protocol.fast_infer
        assert endpoint is not None
        request, self.request = self.request, None  # and its response: outputs lent from an arena go back sooner
        assert request is not None  # _submit set it before its future could finish
        try:
            headers, out = endpoint.encode(future.result(), request, self.binary_default, self.accept_encoding)
        except Exception as e:  # noqa: BLE001
            self._failed(e)
            return
        protocol.fast_reply(self, 200, headers, (out,) if type(out) is bytes else out)

    def _failed(self, error: BaseException) -> None:
        headers = JSON_HEADERS
        if isinstance(error, ServerError):
            status, message, headers = error.status.http_status, error.message, error_headers(error)
        else:  # a bug of ours: answer, log, and keep serving
            log.error("POST infer of model '%s' failed", self.model, exc_info=error)
            status, message = 500, f"internal error: {type(error).__name__}: {error}"
        self.protocol.fast_reply(self, status, headers, [orjson.dumps({"error": message})])


_KEPT = 4096  # entries kept in each of the caches of this module
_HEADS: dict = {}  # (status, id of KeptHeaders) -> (the default headers and own headers it was made with, head)
_JSON_OK: list = [None, b""]  # the default headers the head of a 200 JSON answer was made with, and that head
_IDLE = "nothing (idle keep-alive)"  # the deadline between a connection's requests
_HEADERS = "headers"  # the parser is in the middle of a request's headers
_BODY = "body"  # the parser is in the middle of a request's body
_LINGER = "the rest of a body it was answered for"  # the deadline of a lingering close
LINGER_SECONDS = 2.0  # a lingering close drops what the client still sends for this long at most
LINGER_BYTES = 256 << 20  # and this much at most
MAX_LINE = 16 << 10  # the request line, or one header's name and value, at most (nginx and Triton: 8-16 KiB)
MAX_HEAD = 64 << 10  # a request's line and headers together, at most


class HeadTooLarge(Exception):
    """Raised from a parser callback: the request's head is over a limit; its answer's status."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status

_INFER_PREFIX = b"/v2/models/"
_INFER_SUFFIX = b"/infer"
_MODEL_AT = len(_INFER_PREFIX)
_INFER_LENGTH = len(_INFER_SUFFIX)


_LENGTH, _HEADER_LENGTH, _ACCEPT_ENCODING, _NOT_FAST = "length", "header length", "accept-encoding", "ASGI's"
_TRACE = "trace context"
_FAST_HEADERS = {  # the request headers _fast_infer looks at, and what each is to it
    b"content-length": _LENGTH, b"inference-header-content-length": _HEADER_LENGTH,
    b"accept-encoding": _ACCEPT_ENCODING, b"traceparent": _TRACE, b"tracestate": _TRACE,
    **dict.fromkeys((b"transfer-encoding", b"content-encoding", b"upgrade", b"expect"), _NOT_FAST),  # ASGI's to serve
}
_ROUTES: dict = {}  # request target -> what _infer_route makes of it


def _infer_route(url: bytes) -> tuple[str, str] | None:
    """The model and version (empty for the default) of an infer request's target, the route that
    http_server.INFER matches, taken apart by hand; None for any other target, or one that needs
    decoding. Kept per target: a server's clients ask the same few over and over."""
    route = _ROUTES.get(url, False)
    if route is not False:
        return route
    route = None
    if url.startswith(_INFER_PREFIX) and url.endswith(_INFER_SUFFIX) and b"%" not in url and b"?" not in url \
            and url.isascii():
        parts = url[_MODEL_AT:-_INFER_LENGTH].decode("ascii").split("/")
        if len(parts) == 1 and parts[0]:
            route = (parts[0], "")
        elif len(parts) == 3 and parts[1] == "versions" and parts[0] and parts[2].isdigit():
            route = (parts[0], parts[2])
    if len(_ROUTES) >= _KEPT:
        _ROUTES.clear()
    _ROUTES[url] = route
    return route


class _Drain:
    """The parser of a connection in a lingering close: what arrives is counted and dropped; past
    LINGER_BYTES the connection is closed."""

    __slots__ = ("transport", "dropped")

    def __init__(self, transport: CoalescingTransport):
        self.transport = transport
        self.dropped = 0

    def feed_data(self, data: bytes) -> None:
        self.dropped += len(data)
        if self.dropped > LINGER_BYTES:
            self.transport.close_now()


class GuardedHttpProtocol(HttpToolsProtocol):
    limits = Limits()
    max_body = 0  # the largest body received into one buffer (the application's input limit); 0: none
    fast_infer: InferEndpoint | None = None  # the infer endpoint FastInfer serves; None: all take ASGI
    forward: re.Pattern | None = None  # the pattern of the request headers that reach models (ForwardingHttpProtocol)
    forwarded: dict | None = None  # the request's headers that reach its model, as parameters

    def connection_made(self, transport) -> None:
        self._guard: asyncio.TimerHandle | None = None  # fires at or before the deadline
        self._guard_at = 0.0
        self._deadline: float | None = None  # loop time by which the client must have sent `_what`
        self._what = ""
        self._phase: str | None = None  # what the parser is in the middle of: _HEADERS, _BODY, or None
        self._body: ReceivedBody | None = None
        self._head_bytes = 0  # bytes fed to the parser since the last head was complete, while in a head
        self._heads = 0  # heads completed
        super().connection_made(transport)
        self.flow = PipelineFlowControl(transport, self.pipeline)
        coalescing = CoalescingTransport(transport, self.loop)
        coalescing.lingers = self._lingers
        self.transport = coalescing  # type: ignore[assignment]
        self._draining = False
        cap = self.limits.max_connections or default_max_connections()
        if len(self.connections) > cap:
            log.warning("refusing an HTTP connection: %d are open, the limit is %d", len(self.connections) - 1, cap)
            transport.abort()
            return
        self._arm(self.limits.header_timeout, "its request headers")

    def connection_lost(self, exc) -> None:
        self._disarm()
        guard = getattr(self, "_guard", None)
        if guard is not None:
            guard.cancel()
            self._guard = None
        super().connection_lost(exc)

    # The deadlines move with every request and every piece of a body, so they are kept as a time,
    # and one timer per connection checks them: it is made again only when it would fire too late,
    # not (as a call_later each) several times a request. The parser's callbacks only say where a
    # request stands (`_phase`); the deadline is set once, after the parser has had what arrived:
    # nothing for a request that came whole, the body's for a body still arriving (again with every
    # piece), the headers' for headers still arriving (once: from the request's first bytes).

    def data_received(self, data: bytes) -> None:
        if self._what is _IDLE:  # uvicorn's _unset_keepalive_if_required
            self._deadline = None
        if self._phase is not _BODY and not self._draining:  # in a head, or before one
            allowed = MAX_HEAD - self._head_bytes
            if len(data) > allowed and data.find(b"\r\n\r\n", 0, max(0, allowed) + 3) < 0:
                # the parser gets no more of one head than MAX_HEAD
                heads = self._heads
                if allowed > 0 and not self._feed(data[:allowed]):
                    return
                if self._heads == heads:
                    self._refuse_head(431, f"the request's head is larger than {MAX_HEAD} bytes")
                else:  # the head ended within it (which reset the count): on with the rest
                    self.data_received(data[allowed:])
                return
            self._head_bytes += len(data)
        self._feed(data)

    def _feed(self, data: bytes) -> bool:
        """Parse what arrived and set the deadline for what is still to come; False when the
        connection has been answered for good (its request refused)."""
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as e:  # uvicorn's answers to what its parser refuses
            if isinstance(e.__context__, HeadTooLarge):
                self._refuse_head(e.__context__.status, str(e.__context__))
                return False
            self.logger.warning("Invalid HTTP request received.")
            self.send_400_response("Invalid HTTP request received.")
            return False
        except httptools.HttpParserUpgrade:
            if self._should_upgrade():
                self.handle_websocket_upgrade()
            else:
                self._unsupported_upgrade_warning()
            return False
        if self._draining or self.transport.is_closing():
            return False
        phase = self._phase
        if phase is _BODY:
            self._arm(self.limits.body_timeout, "its request body")
        elif phase is _HEADERS and self._deadline is None:
            self._arm(self.limits.header_timeout, "its request headers")
        return True

    def _arm(self, seconds: float, what: str) -> None:
        if seconds <= 0:
            self._deadline = None
            return
        self._deadline = deadline = self.loop.time() + seconds
        self._what = what
        if self._guard is not None and self._guard_at <= deadline:
            return  # it fires first, and looks again then
        if self._guard is not None:
            self._guard.cancel()
        self._guard_at = deadline
        self._guard = self.loop.call_at(deadline, self._check)

    def _disarm(self) -> None:
        self._deadline = None

    def _check(self) -> None:
        self._guard = None
        deadline = self._deadline
        if deadline is None:
            return
        if self.loop.time() < deadline:  # moved on since the timer was made
            self._guard_at = deadline
            self._guard = self.loop.call_at(deadline, self._check)
            return
        self._deadline = None
        self._expired(self._what)

    def _refuse_head(self, status: int, message: str) -> None:
        """Answer a request whose head is over a limit, and close lingering (its client is likely
        still sending the head)."""
        log.info("refusing an HTTP request from %s: %s",
                 f"{self.client[0]}:{self.client[1]}" if self.client else "a client", message)
        body = orjson.dumps({"error": message})
        self.transport.write(b"%scontent-type: application/json\r\ncontent-length: %d\r\nconnection: close\r\n\r\n%s"
                             % (STATUS_LINE[status], len(body), body))
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete:
            cycle.disconnected = True
            cycle.message_event.set()
        self._linger()

    def _linger(self) -> None:
        """Shut the connection for writing, and read and drop what the client still sends, for up to
        LINGER_SECONDS and LINGER_BYTES, before closing it."""
        self._draining = True
        self._phase = None  # the deadline is the lingering close's
        self.pipeline.clear()
        self.parser = _Drain(self._coalescing)  # type: ignore[assignment]
        self.transport.write_eof()
        self._arm(LINGER_SECONDS, _LINGER)
        self.flow.resume_reading()

    @property
    def _coalescing(self) -> CoalescingTransport:
        """The connection's transport, as connection_made wraps it."""
        return cast(CoalescingTransport, self.transport)

    def _lingers(self) -> bool:
        """Asked as the connection is closed after a response (a client's `Connection: close`):
        when the client is still sending the request's body (a 413 answered before it was read), the
        connection is shut for writing and the rest of the body is read and dropped, for up to
        LINGER_SECONDS and LINGER_BYTES, before it closes. Closed at once with unread data, the kernel
        resets the connection, and a client that sends its whole body before it reads (Python's
        http.client, urllib) sees that reset instead of the answer."""
        cycle = self.cycle
        if self._draining or type(cycle) is FastInfer or not getattr(cycle, "more_body", False) \
                or not cycle.response_complete or self.transport.is_closing():
            return False
        self._linger()
        return True

    def _expired(self, what: str) -> None:
        if what is _LINGER:
            log.info("closing an HTTP connection from %s that was still sending a body %.0fs after its answer",
                     f"{self.client[0]}:{self.client[1]}" if self.client else "a client", LINGER_SECONDS)
            self._coalescing.close_now()
            return
        if what is _IDLE:  # uvicorn's keep-alive timeout
            if not self.transport.is_closing():
                self.transport.close()
            return
        if self.flow is not None and self.flow.read_paused:  # the server is the slow one: wait on
            self._arm(self.limits.body_timeout, what)
            return
        log.info("closing an HTTP connection from %s that took too long to send %s",
                 f"{self.client[0]}:{self.client[1]}" if self.client else "a client", what)
        if self.cycle is not None and not self.cycle.response_complete:
            self.cycle.disconnected = True
            self.cycle.message_event.set()
        self.transport.close()

    def _unset_keepalive_if_required(self) -> None:  # data arrived, or the connection ended
        if self._what is _IDLE:
            self._deadline = None

    def on_response_complete(self) -> None:
        """uvicorn's, with the keep-alive timeout kept on the connection's timer."""
        self.server_state.total_requests += 1
        if self.transport.is_closing() or self._draining:
            return
        if self.pipeline:
            cycle, app = self.pipeline.pop()
            self._start_asgi_task(cycle, app)
            self.flow.resume_reading()  # once the requests read ahead are all started
        else:
            if self.flow.read_paused:
                self.flow.resume_reading()
            self._arm(self.timeout_keep_alive, _IDLE)

    # ---- parser callbacks ----

    def on_message_begin(self) -> None:
        """uvicorn's, less the ASGI scope, which only a request that takes ASGI gets (`_scope`)."""
        self._body = None
        self.url = b""
        self.expect_100_continue = False
        self.headers = []
        self._phase = _HEADERS

    def on_url(self, url: bytes) -> None:
        self.url += url
        if len(self.url) > MAX_LINE:
            raise HeadTooLarge(414, f"the request's target is longer than {MAX_LINE} bytes")

    def on_header(self, name: bytes, value: bytes) -> None:
        """uvicorn's, less its look for `Expect: 100-continue`, made once per request instead: by
        _fast_infer (which leaves any request with an Expect header to ASGI) or before ASGI's cycle."""
        if len(name) + len(value) > MAX_LINE:
            raise HeadTooLarge(431, f"the request's header '{name[:64].decode('latin-1')}' is longer than "
                                    f"{MAX_LINE} bytes")
        self.headers.append((name.lower(), value.rstrip(b" \t")))  # llhttp keeps trailing whitespace

    def on_headers_complete(self) -> None:
        self._deadline = None  # _disarm(), as every call below is made for every request
        self._head_bytes = 0
        self._heads += 1
        self._phase = _BODY  # until the message is complete
        fast = self._fast_infer() if self.fast_infer is not None else None
        if fast is not None:
            self.cycle = fast  # type: ignore[assignment]  # it stands in for uvicorn's cycle
            return
        for key, value in self.headers:
            if key == b"expect" and value.lower() == b"100-continue":
                self.expect_100_continue = True
        self._scope()
        super().on_headers_complete()
        if self.cycle is not None and self.cycle.more_body:
            length = _declared_length(self.headers)
            if LARGE_BODY <= length <= self.max_body:
                self._body = cast(dict, self.scope)[BODY_KEY] = ReceivedBody(length)

    def _scope(self) -> None:
        """The request's ASGI scope, as uvicorn's on_message_begin makes it."""
        scope = {"type": "http", "asgi": {"version": self.asgi_version, "spec_version": "2.3"},
                 "http_version": "1.1", "server": self.server, "client": self.client, "scheme": self.scheme,
                 "root_path": self.root_path, "headers": self.headers, "state": self.app_state.copy()}
        self.scope = cast(Any, scope)  # uvicorn's on_headers_complete adds the method, path and query

    def _fast_infer(self) -> FastInfer | None:
        """A FastInfer for this request when it is an infer whose body can be taken whole without
        ASGI, else None."""
        route = _infer_route(self.url)
        if route is None or self.parser.get_method() != b"POST" or self.flow.write_paused \
                or (self.cycle is not None and not self.cycle.response_complete):
            return None
        endpoint = self.fast_infer
        assert endpoint is not None  # asked only where there is one
        length = -1
        header_length = None
        accept_encoding = ""
        trace_context = None
        for key, value in self.headers:  # what endpoint.headers reads too, in the same pass
            kind = _FAST_HEADERS.get(key)
            if kind is None:
                continue
            if kind is _LENGTH:
                if not value.isdigit():
                    return None
                length = int(value)
            elif kind is _HEADER_LENGTH:
                if not value.isdigit():
                    return None  # the ASGI path reads it, or words why not
                header_length = int(value)
            elif kind is _ACCEPT_ENCODING:
                accept_encoding = value.decode("latin-1")
            elif kind is _TRACE:
                trace_context = trace_context or {}
                trace_context[key.decode()] = value.decode("latin-1")
            else:
                return None
        if not 0 <= length < LARGE_BODY or length > endpoint.max_input_size:
            return None
        keep_alive = self.parser.should_keep_alive() and self.parser.get_http_version() != "1.0"
        return FastInfer(self, route[0], route[1], header_length, accept_encoding, keep_alive, trace_context)

    def on_body(self, body: bytes) -> None:
        cycle = self.cycle
        if type(cycle) is FastInfer:
            cycle.body.append(body)
        elif self._body is not None:
            if not cycle.response_complete:  # else answered already: the rest is dropped
                self._body.write(body)  # the parser delivers no more than the declared length
        else:
            super().on_body(body)

    def on_message_complete(self) -> None:
        self._deadline = None  # _disarm()
        self._phase = None
        self._body = None
        cycle = self.cycle
        if type(cycle) is FastInfer and not cycle.response_complete:
            cycle.start()
            return
        super().on_message_complete()

    def _head(self, status: int, headers: list) -> bytes:
        """A response's head up to the value of its Content-Length. The server's default headers
        (the date among them) are a new list each second, and most responses have the same status
        and KeptHeaders: those heads are kept for reuse until the default headers change."""
        default = self.server_state.default_headers
        kept = type(headers) is KeptHeaders
        if kept:
            cached = _HEADS.get((status, id(headers)))
            if cached is not None and cached[0] is default and cached[1] is headers:
                return cached[2]
        head = [STATUS_LINE[status]]
        for name, value in default:
            head += (name, b": ", value, b"\r\n")
        for name, value in headers:
            head += (name, b": ", value, b"\r\n")
        head.append(b"content-length: ")
        joined = b"".join(head)
        if kept:
            if len(_HEADS) >= _KEPT:
                _HEADS.clear()
            _HEADS[(status, id(headers))] = (default, headers, joined)
        return joined

    def json_head(self) -> bytes:
        """_head(200, JSON_HEADERS), kept apart: most answers have it."""
        default = self.server_state.default_headers
        kept = _JSON_OK
        if kept[0] is not default:
            kept[1] = self._head(200, JSON_HEADERS)
            kept[0] = default
        return kept[1]

    def fast_reply(self, cycle: FastInfer, status: int, headers: list, parts: Sequence) -> None:
        """Write a FastInfer's response: head and body in one system call."""
        if cycle.response_complete:
            return
        cycle.response_complete = True
        if cycle.disconnected:
            return
        head = self.json_head() if headers is JSON_HEADERS and status == 200 else self._head(status, headers)
        length = len(parts[0]) if len(parts) == 1 else sum(len(p) for p in parts)
        if cycle.keep_alive:
            self.transport.writelines((b"%s%d\r\n\r\n" % (head, length), *parts))
        else:
            self.transport.writelines((b"%s%d\r\nconnection: close\r\n\r\n" % (head, length), *parts))
            self.transport.close()
        self.on_response_complete()


class ForwardingHttpProtocol(GuardedHttpProtocol):
    """The protocol of a listener that forwards request headers to models
    (--http-header-forward-pattern): it keeps each request's header names as they were sent, and
    the parameters they make (`forwarded`, also in an ASGI request's scope)."""

    forward: re.Pattern  # set by protocol_class

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self.sent_headers: list = []

    def on_header(self, name: bytes, value: bytes) -> None:
        super().on_header(name, value)
        self.sent_headers.append((name, self.headers[-1][1]))  # the name as sent, the value as stored

    def on_headers_complete(self) -> None:
        self.forwarded = forwarded(self.forward, self.sent_headers)
        super().on_headers_complete()
        if type(self.cycle) is not FastInfer and getattr(self, "scope", None) is not None:
            cast(dict, self.scope)[FORWARDED_KEY] = self.forwarded


def protocol_class(limits: Limits, max_body: int = 0, fast_infer=None,
                   forward: re.Pattern | None = None) -> type[GuardedHttpProtocol]:
    """The protocol class for one listener with these limits (uvicorn takes a class); bodies up to
    `max_body` bytes are received into one buffer each; `fast_infer`: the infer endpoint answered
    without ASGI where it can be (None: never); `forward`: the headers that reach models as request
    parameters."""
    base = GuardedHttpProtocol if forward is None else ForwardingHttpProtocol
    return type(base.__name__, (base,), {"limits": limits, "max_body": max_body, "fast_infer": fast_infer,
                                         "forward": forward})
