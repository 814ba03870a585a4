"""The server's own loggers, a hierarchy apart from the host program's `logging` tree.

The in-process server (tritonmp.tritonserver) writes its log where its Options say, and only there,
as Triton's does: no record reaches the program's own loggers or the handlers that test frameworks
attach to every logger of that tree. The `tritonmp` command owns its process and also configures
the program's root logger the same way (LogSettings), for what its libraries log."""

from __future__ import annotations

import logging

_manager = logging.Manager(logging.RootLogger(logging.WARNING))
ROOT: logging.Logger = _manager.root
ROOT.manager = _manager  # so that a new level clears this hierarchy's caches, not the program's


def get_logger(name: str) -> logging.Logger:
    """The logger `tritonmp.<name>` of the server's hierarchy."""
    return _manager.getLogger(f"tritonmp.{name}")
