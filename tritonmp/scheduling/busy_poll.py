"""Busy polling: the event loop stays awake for a short window when its next event is near.

A request at low concurrency goes through several sleeps and wake-ups: the server sleeps while the
worker runs the batch and is woken by its answer; after answering, it sleeps until the client's
next request wakes it. Waking a sleeping process costs tens of microseconds where an
inter-processor interrupt is dear (virtual machines above all), which is a large share of a
sub-millisecond request. So when the server sends a batch to a worker, and when a worker answers,
the loop polls instead of sleeping for up to `--busy-poll-us` microseconds: a callback that puts
itself back on the ready queue makes each turn's poll return at once, so sockets, timers and the
worker's answer are seen as soon as they are ready.

Under load the loop seldom sleeps anyway, and the callback costs one call per turn. Idle, nothing
polls: the window opens only on a batch sent or answered, and closes after `--busy-poll-us`
without one. The cost is a core kept busy while a server at low concurrency waits for work (at
most the window after each batch); 0 turns it off.
"""

from __future__ import annotations

import asyncio
import time

DEFAULT_US = 500


class BusyPoll:
    """One event loop's polling window. `touch()` when the next event is near."""

    __slots__ = ("window_ns", "until", "_loop", "_polling")

    def __init__(self, window_us: int = DEFAULT_US):
        if window_us < 0:
            raise ValueError(f"the busy-poll window must be 0 or more microseconds, got {window_us}")
        self.window_ns = window_us * 1000
        self.until = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._polling = False

    def touch(self) -> None:
        """Keep the running loop awake for the window from now."""
        if not self.window_ns:
            return
        self.until = time.monotonic_ns() + self.window_ns
        if not self._polling:
            self._polling = True
            loop = self._loop
            if loop is None or loop.is_closed():  # looked up once: each lookup costs a getpid system call
                loop = self._loop = asyncio.get_running_loop()
            loop.call_soon(self._poll)

    def _poll(self) -> None:
        if time.monotonic_ns() < self.until:
            self._loop.call_soon(self._poll)
        else:
            self._polling = False
