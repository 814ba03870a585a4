"""systemd's notify protocol, without libsystemd: READY=1 once the server is ready, STOPPING=1
when it starts to stop, STATUS= lines, and WATCHDOG=1 keep-alives at half the WatchdogSec that
systemd hands over in WATCHDOG_USEC. Does nothing when NOTIFY_SOCKET is not set."""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import Mapping

from ..logs import get_logger

log = get_logger("systemd")


class Notifier:
    def __init__(self, env: Mapping[str, str] | None = None):
        env = os.environ if env is None else env
        address = env.get("NOTIFY_SOCKET", "")
        self.address = "\0" + address[1:] if address.startswith("@") else address
        self.sock: socket.socket | None = None
        if self.address:
            self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
        watchdog_pid = env.get("WATCHDOG_PID")
        usec = env.get("WATCHDOG_USEC", "")
        mine = watchdog_pid is None or watchdog_pid == str(os.getpid())
        self.watchdog_interval = int(usec) / 2e6 if usec.isdigit() and int(usec) > 0 and mine else 0.0

    @property
    def enabled(self) -> bool:
        return self.sock is not None

    def notify(self, *lines: str) -> None:
        if self.sock is None:
            return
        try:
            self.sock.sendto("\n".join(lines).encode(), self.address)
        except OSError as e:  # systemd gone or socket unreachable: never a reason to fail serving
            log.debug("sd_notify failed: %s", e)

    async def watchdog(self) -> None:
        """Keep-alives from the event loop itself, so a stuck loop stops them and systemd acts."""
        if not self.watchdog_interval:
            return
        while True:
            self.notify("WATCHDOG=1")
            await asyncio.sleep(self.watchdog_interval)

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None
