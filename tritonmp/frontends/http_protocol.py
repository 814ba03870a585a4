"""uvicorn's HTTP/1.1 protocol with the limits a server on an open network needs, which uvicorn
lacks: a deadline for a request's headers (from the connection's first byte, or a keep-alive
request's first byte, so trickling them slowly does not help), a deadline for each piece of a
request body once it has started, and a cap on open connections per listener (connections past it
are closed at once, before they can use up the process's file descriptors). The keep-alive timeout
between requests is uvicorn's own `timeout_keep_alive`.
"""

from __future__ import annotations

import asyncio
import logging
import resource
from dataclasses import dataclass

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

log = logging.getLogger("tritonmp.http")


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


class GuardedHttpProtocol(HttpToolsProtocol):
    limits = Limits()

    def connection_made(self, transport) -> None:  # type: ignore[override]
        self._guard: asyncio.TimerHandle | None = None
        super().connection_made(transport)
        cap = self.limits.max_connections or default_max_connections()
        if len(self.connections) > cap:
            log.warning("refusing an HTTP connection: %d are open, the limit is %d", len(self.connections) - 1, cap)
            transport.abort()
            return
        self._arm(self.limits.header_timeout, "its request headers")

    def connection_lost(self, exc) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self, seconds: float, what: str) -> None:
        self._disarm()
        if seconds > 0:
            self._guard = self.loop.call_later(seconds, self._expired, what)

    def _disarm(self) -> None:
        if getattr(self, "_guard", None) is not None:
            self._guard.cancel()
            self._guard = None

    def _expired(self, what: str) -> None:
        self._guard = None
        if self.flow is not None and self.flow.read_paused:  # the server is the slow one: wait on
            self._arm(self.limits.body_timeout, what)
            return
        log.info("closing an HTTP connection from %s that took too long to send %s",
                 f"{self.client[0]}:{self.client[1]}" if self.client else "a client", what)
        if self.cycle is not None and not self.cycle.response_complete:
            self.cycle.disconnected = True
            self.cycle.message_event.set()
        self.transport.close()

    # ---- parser callbacks ----

    def on_message_begin(self) -> None:
        super().on_message_begin()
        if self._guard is None:  # a keep-alive connection's next request: its own deadline
            self._arm(self.limits.header_timeout, "its request headers")

    def on_headers_complete(self) -> None:
        self._disarm()
        super().on_headers_complete()
        if self.cycle is not None and self.cycle.more_body:
            self._arm(self.limits.body_timeout, "its request body")

    def on_body(self, body: bytes) -> None:
        super().on_body(body)
        self._arm(self.limits.body_timeout, "its request body")

    def on_message_complete(self) -> None:
        self._disarm()
        super().on_message_complete()


def protocol_class(limits: Limits) -> type[GuardedHttpProtocol]:
    """The protocol class for one listener with these limits (uvicorn takes a class)."""
    return type("GuardedHttpProtocol", (GuardedHttpProtocol,), {"limits": limits})
