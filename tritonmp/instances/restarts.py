"""When a model instance whose worker died is started again, and when it is given up: restarts back
off from 0.1 s to 10 s (the count starts over once a worker has lived STABLE_SECS), and an instance
that dies or fails to start CRASH_LOOP_DEATHS times within CRASH_LOOP_SECS stays down."""

from __future__ import annotations

import signal

RESTART_DELAYS = (0.1, 0.5, 1.0, 2.0, 5.0, 10.0)
STABLE_SECS = 30.0
CRASH_LOOP_DEATHS = 5  # this many deaths (or failed restarts) within CRASH_LOOP_SECS: give up
CRASH_LOOP_SECS = 60.0


class RestartPolicy:
    """One instance's recent deaths and restarts."""

    def __init__(self) -> None:
        self.restarts = 0  # since the worker last lived STABLE_SECS
        self.deaths: list[float] = []  # when it died or failed to start, within CRASH_LOOP_SECS

    def died(self, now: float, started_at: float) -> bool:
        """Record a death of a worker started at `started_at`; True when the instance should stay down."""
        if now - started_at > STABLE_SECS:
            self.restarts = 0
        return self.failed(now)

    def failed(self, now: float) -> bool:
        """Record a failed restart; True when the instance should stay down."""
        self.deaths = [t for t in self.deaths if now - t < CRASH_LOOP_SECS] + [now]
        return len(self.deaths) >= CRASH_LOOP_DEATHS

    def next_delay(self) -> float:
        """Seconds to wait before the next restart, which this counts."""
        delay = RESTART_DELAYS[min(self.restarts, len(RESTART_DELAYS) - 1)]
        self.restarts += 1
        return delay

    def gave_up(self, name: str, reason: str) -> str:
        """Why the instance `name` stays down, after its last death for `reason`."""
        return (f"instance '{name}' died or failed to start {len(self.deaths)} times in {CRASH_LOOP_SECS:.0f}s "
                f"(last: {reason}); it is no longer restarted")


def describe_exit(code: int | None) -> str:
    """How a worker process ended, from its exit code, for the log and its requests' errors."""
    if code is None:
        return "stopped answering"
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"
