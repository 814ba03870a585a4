"""Running an ASGI app on another thread's event loop for a caller on its own loop: the caller hands
over a request (scope and whole body), the app runs where the server's state lives (the in-process
engine's loop), and its response messages come back across the loops.

Ray Serve's replicas answer HTTP on a loop of Serve's; tritonmp's HTTP app must run on the engine's
loop, whose scheduler and model manager are not thread-safe. `relay` is the crossing between them."""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any

Message = dict[str, Any]
AsgiApp = Callable[[dict, Callable[[], Awaitable[Message]], Callable[[Message], Awaitable[None]]],
                   Coroutine[Any, Any, None]]

_DONE = object()  # the app has returned (or raised: then the exception follows it)


@dataclass
class Relayed:
    """An app's answer: status and headers, then the body whole (`body`) when the app said its
    length, or as it comes (`stream`, for a response without Content-Length, such as server-sent
    events)."""

    status: int
    headers: list[tuple[bytes, bytes]]
    body: bytes = b""
    stream: AsyncIterator[bytes] | None = None


class _Exchange:
    """One request's messages between the two loops."""

    def __init__(self, caller: asyncio.AbstractEventLoop, body: bytes):
        self.caller = caller
        self.messages: asyncio.Queue[Any] = asyncio.Queue()  # on the caller's loop
        self.body: bytes | None = body

    # -- on the app's loop -------------------------------------------------------------------
    async def receive(self) -> Message:
        if self.body is not None:
            body, self.body = self.body, None
            return {"type": "http.request", "body": body, "more_body": False}
        # nothing more comes: a caller that goes away cancels the app's run instead
        await asyncio.get_running_loop().create_future()
        return {"type": "http.disconnect"}

    async def send(self, message: Message) -> None:
        self.caller.call_soon_threadsafe(self.messages.put_nowait, message)

    # -- for the caller ------------------------------------------------------------------------
    def finished(self, future: concurrent.futures.Future) -> None:  # on the app's thread
        """The app's run ended: its exception, if any, then the end (to a caller still there)."""
        try:
            if not future.cancelled() and future.exception() is not None:
                self.caller.call_soon_threadsafe(self.messages.put_nowait, future.exception())
            self.caller.call_soon_threadsafe(self.messages.put_nowait, _DONE)
        except RuntimeError:  # the caller's loop has closed
            pass

    async def next(self) -> Any:
        item = await self.messages.get()
        if isinstance(item, BaseException):
            raise item
        return item


async def relay(app: AsgiApp, scope: dict, body: bytes, loop: asyncio.AbstractEventLoop) -> Relayed:
    """Run `app` on `loop` (another thread's) for one HTTP request and return its response; the
    caller's cancellation cancels the app's run. An app that ends without answering is a
    RuntimeError."""
    exchange = _Exchange(asyncio.get_running_loop(), body)
    future: concurrent.futures.Future[None] = asyncio.run_coroutine_threadsafe(
        app(scope, exchange.receive, exchange.send), loop)
    future.add_done_callback(exchange.finished)
    try:
        start = await exchange.next()
        if start is _DONE or start.get("type") != "http.response.start":
            raise RuntimeError("the app ended without a response")
        headers = [(bytes(k), bytes(v)) for k, v in start.get("headers", [])]
        if any(k.lower() == b"content-length" for k, _ in headers):
            parts = []
            while True:
                message = await exchange.next()
                if message is _DONE:
                    break
                parts.append(message.get("body", b""))
                if not message.get("more_body", False):
                    break
            # bytes, not views: an output's view holds its worker's arena, and the caller may pickle it
            body = parts[0] if len(parts) == 1 and isinstance(parts[0], bytes) else b"".join(parts)
            return Relayed(start["status"], headers, body)
        return Relayed(start["status"], headers, stream=_stream(exchange, future))
    except BaseException:
        future.cancel()  # the caller went away (or the app failed): stop the app's run
        raise


async def _stream(exchange: _Exchange, future: concurrent.futures.Future) -> AsyncIterator[bytes]:
    try:
        while True:
            message = await exchange.next()
            if message is _DONE:
                return
            chunk = message.get("body", b"")
            if chunk:
                yield bytes(chunk)
            if not message.get("more_body", False):
                return
    finally:
        future.cancel()  # a reader that stopped early stops the app's run; after the end, a no-op
