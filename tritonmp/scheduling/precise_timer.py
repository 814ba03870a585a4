"""A one-shot timer with sub-millisecond precision for the event loop, on a Linux timerfd.

uvloop's timers (libuv's) count whole milliseconds: a wait of 100 µs (a typical dynamic batching
`max_queue_delay_microseconds`) armed with `call_at` fires on the next turn of the loop, before its
deadline, and re-arming it until the deadline passes turns the loop into a busy wait that burns a
core whenever a request waits for company. A timerfd, watched by the loop's poller like a socket,
wakes it at the deadline itself (CLOCK_MONOTONIC, the clock of time.monotonic_ns).
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import os
from collections.abc import Callable

CLOCK_MONOTONIC = 1
TFD_TIMER_ABSTIME = 1
_NS = 1_000_000_000


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _Itimerspec(ctypes.Structure):
    _fields_ = [("it_interval", _Timespec), ("it_value", _Timespec)]


_libc = None


def _lib():
    global _libc
    if _libc is None:
        lib = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        lib.timerfd_create.argtypes = [ctypes.c_int, ctypes.c_int]
        lib.timerfd_settime.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.POINTER(_Itimerspec),
                                        ctypes.POINTER(_Itimerspec)]
        _libc = lib
    return _libc


class PreciseTimer:
    """Calls `callback` on the loop once CLOCK_MONOTONIC reaches the time given to `at`; `cancel`
    disarms it, `close` gives its file descriptor back."""

    def __init__(self, loop: asyncio.AbstractEventLoop, callback: Callable[[], None]):
        lib = _lib()
        fd = lib.timerfd_create(CLOCK_MONOTONIC, os.O_NONBLOCK | os.O_CLOEXEC)
        if fd < 0:
            errno = ctypes.get_errno()
            raise OSError(errno, f"timerfd_create: {os.strerror(errno)}")
        self.fd = fd
        self._loop = loop
        self._callback = callback
        self._spec = _Itimerspec()
        loop.add_reader(fd, self._fired)

    def at(self, deadline_ns: int) -> None:
        """Fire at `deadline_ns` (time.monotonic_ns's clock), or at once if it has passed."""
        deadline_ns = max(deadline_ns, 1)  # an all-zero time would disarm the timer instead
        self._set(deadline_ns // _NS, deadline_ns % _NS)

    def cancel(self) -> None:
        self._set(0, 0)

    def _set(self, seconds: int, nanoseconds: int) -> None:
        value = self._spec.it_value
        value.tv_sec, value.tv_nsec = seconds, nanoseconds
        if _lib().timerfd_settime(self.fd, TFD_TIMER_ABSTIME, ctypes.byref(self._spec), None) < 0:
            errno = ctypes.get_errno()
            raise OSError(errno, f"timerfd_settime: {os.strerror(errno)}")

    def _fired(self) -> None:
        try:
            os.read(self.fd, 8)  # the expiry count; reading it re-arms the descriptor for the poller
        except BlockingIOError:  # cancelled or re-armed after it became readable
            return
        self._callback()

    def close(self) -> None:
        if self.fd >= 0:
            self._loop.remove_reader(self.fd)
            os.close(self.fd)
            self.fd = -1
