"""The server's log settings as Triton's logging extension shows and changes them, applied to
Python's logging for the whole frontend at once."""

from __future__ import annotations

import logging
import sys
from typing import Any

from .. import logs
from ..errors import invalid, unsupported

FORMATS = {
    "default": ("%(levelname).1s%(asctime)s.%(msecs)03d %(process)d %(name)s] %(message)s", "%m%d %H:%M:%S"),
    "ISO8601": ("%(asctime)sZ %(levelname).1s %(process)d %(name)s] %(message)s", "%Y-%m-%dT%H:%M:%S"),
}


class LogSettings:
    def __init__(self, verbose: int = 0, info: bool = True, warning: bool = True, error: bool = True,
                 log_format: str = "default", log_file: str = "", owns_process: bool = True):
        self.settings: dict[str, Any] = {"log_file": log_file, "log_info": info, "log_warning": warning,
                                         "log_error": error, "log_verbose_level": verbose, "log_format": log_format}
        self.handler: logging.Handler | None = None
        # the server's own loggers always; the program's root logger too for the `tritonmp` command,
        # but not inside another program (the in-process API), whose own logging is left alone
        self.roots = [logs.ROOT, logging.getLogger()] if owns_process else [logs.ROOT]
        self.levels_before = [root.level for root in self.roots]
        self.apply()

    def close(self) -> None:
        """Detach and close this server's handler, and give the loggers back their levels (the
        in-process server stops; another one in the same program logs as it did)."""
        self._detach()
        for root, level in zip(self.roots, self.levels_before):
            root.setLevel(level)

    def _detach(self) -> None:
        if self.handler is not None:
            for root in self.roots:
                root.removeHandler(self.handler)
            self.handler.close()
            self.handler = None

    def apply(self) -> None:
        s = self.settings
        self._detach()
        self.handler = logging.FileHandler(s["log_file"]) if s["log_file"] else logging.StreamHandler(sys.stderr)
        fmt, datefmt = FORMATS[s["log_format"]]
        formatter = logging.Formatter(fmt, datefmt)
        if s["log_format"] == "ISO8601":
            import time

            formatter.converter = time.gmtime
        self.handler.setFormatter(formatter)
        # each level on or off by itself, as Triton's flags are (verbose lines need log_info too)
        enabled = {logging.DEBUG: s["log_verbose_level"] > 0 and s["log_info"], logging.INFO: s["log_info"],
                   logging.WARNING: s["log_warning"], logging.ERROR: s["log_error"]}
        self.handler.addFilter(lambda record: enabled[min(max(record.levelno, logging.DEBUG) // 10 * 10,
                                                          logging.ERROR)])
        level = min((lv for lv, on in enabled.items() if on), default=logging.CRITICAL + 1)
        for root in self.roots:
            root.addHandler(self.handler)
            root.setLevel(level)
        for noisy in ("uvicorn.error", "uvicorn"):
            logging.getLogger(noisy).setLevel(max(level, logging.WARNING))

    def update(self, changes: dict) -> dict:
        """Apply some settings (Triton's names and types); all are checked before any is applied.
        The log file is the operator's choice alone (--log-file): a client that could move it could
        write the server's log anywhere the server may write, so it is refused as Triton does."""
        if changes.get("log_file") is not None:
            raise unsupported("log file location can not be updated through network protocol")
        checked = dict(self.settings)
        for key, value in changes.items():
            if key not in checked:
                raise invalid(f"log setting '{key}' is not known; known: {', '.join(self.settings)}")
            if value is None:
                continue
            want = type(self.settings[key])
            if want is int and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
                raise invalid(f"log setting '{key}' must be an unsigned integer")
            if want is bool and not isinstance(value, bool):
                raise invalid(f"log setting '{key}' must be a boolean")
            if want is str and not isinstance(value, str):
                raise invalid(f"log setting '{key}' must be a string")
            if key == "log_format" and value not in FORMATS:
                raise invalid(f"log_format must be one of: {', '.join(FORMATS)}")
            checked[key] = value
        self.settings = checked
        self.apply()
        return dict(self.settings)
