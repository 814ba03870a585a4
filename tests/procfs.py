"""What the tests read of processes from /proc, in one place: a process's fields (stat), its
resident memory, CPU time, parent, children and whether it runs."""

from __future__ import annotations

import os
from pathlib import Path


def stat(pid: int) -> list[str]:
    """The fields of /proc/PID/stat after the command name: [0] the state, [1] the parent, [11] and
    [12] user and system ticks; FileNotFoundError once the process is gone."""
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()


def alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie waiting for its parent does not)."""
    try:
        return stat(pid)[0] != "Z"
    except OSError:
        return False


def parent(pid: int) -> int:
    return int(stat(pid)[1])


def cpu_seconds(pid: int) -> float:
    fields = stat(pid)
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_bytes(pid: int, field: str = "VmRSS") -> int:
    """Resident memory (VmRSS; VmHWM, its peak so far); FileNotFoundError once the process is gone."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise ProcessLookupError(f"process {pid} has no resident memory (a zombie)")


def children(pid: int) -> list[int]:
    """The children of every thread of `pid`."""
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            out += [int(c) for c in (task / "children").read_text().split()]
        except FileNotFoundError:
            continue
    return out
