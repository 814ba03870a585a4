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

A turn that found nothing to do yields the processor (sched_yield). Polling, the loop is a task
that never sleeps, and the kernel puts the client thread its answer wakes on the same processor
(a socket's wake-up tells the scheduler that the waker will sleep soon, which a polling loop does
not): without the yield, that thread waited for the end of the loop's time slice, while the loop
found nothing. With it, measured against Triton on 2 cores under perf_analyzer at concurrency 16,
the p99 latency was lower in 5 of 5 rounds over HTTP (ratio to Triton's 0.77-0.99 against
0.95-1.05) and in 5 of 5 over gRPC, throughput level. A turn that did something does not yield.
Under wrk -c64 (one client thread) it cost about 0.5 µs of the frontend's CPU per request in 3
of 4 pairs.
"""

from __future__ import annotations

import asyncio
import os
import time

from ..settings import DEFAULT_BUSY_POLL_US

EMPTY_TURN_NS = 5_000  # a turn of the loop this short since the last poll found nothing to do


class BusyPoll:
    """One event loop's polling window. `touch()` when the next event is near."""

    __slots__ = ("window_ns", "until", "_loop", "_polling", "_last")

    def __init__(self, window_us: int = DEFAULT_BUSY_POLL_US):
        if window_us < 0:
            raise ValueError(f"the busy-poll window must be 0 or more microseconds, got {window_us}")
        self.window_ns = window_us * 1000
        self.until = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._polling = False
        self._last = 0  # when the loop last polled

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
        now = time.monotonic_ns()
        if now < self.until:
            if now - self._last < EMPTY_TURN_NS:
                os.sched_yield()  # nothing to do: a task waiting for this processor runs now
            self._last = now
            loop = self._loop
            assert loop is not None, "polling starts on a loop (touch)"
            loop.call_soon(self._poll)
        else:
            self._polling = False
