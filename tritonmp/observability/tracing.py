"""Triton's trace extension: settings (global and per model) and TIMESTAMPS and TENSORS traces of
sampled requests, written to the trace file as Triton's JSON array of entries (mode "triton"), or
exported as OpenTelemetry spans (mode "opentelemetry", otel.py)."""

from __future__ import annotations

import itertools
import json
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from ..errors import invalid, unsupported
from ..logs import get_logger
from . import otel

log = get_logger("trace")

LEVELS = ("OFF", "TIMESTAMPS", "TENSORS")
DEFAULTS = {"trace_file": "", "trace_level": ["OFF"], "trace_rate": "1000", "trace_count": "-1",
            "log_frequency": "0", "trace_mode": "triton"}


@dataclass
class Trace:
    id: int
    model: str
    version: int
    timestamps: list[tuple[str, int]] = field(default_factory=list)
    levels: tuple[str, ...] = ("TIMESTAMPS",)
    tensors: list[dict] = field(default_factory=list)  # TENSORS level: the tensors, as Triton writes them
    spans: Any = None  # opentelemetry mode: its span ids (otel.Spans, made by OtelExport.start)

    def context(self) -> str:
        """Its model span's W3C context as JSON (opentelemetry mode), for its BLS calls; else ""."""
        return otel.OtelExport.context(self.spans) if self.spans is not None else ""

    def mark(self, name: str, ns: int | None = None) -> None:
        self.timestamps.append((name, time.monotonic_ns() if ns is None else ns))

    def add_tensors(self, activity: str, tensors) -> None:
        """Record tensors (core.Tensor) at the TENSORS level: TENSOR_QUEUE_INPUT for a request's
        inputs, TENSOR_BACKEND_OUTPUT for its outputs. A tensor in the client's shared memory is
        recorded without its data (the frontend never reads those bytes)."""
        if "TENSORS" not in self.levels:
            return
        for t in tensors:
            self.tensors.append({"id": self.id, "activity": activity, "tensor": {
                "name": t.name, "data": _tensor_text(t), "shape": ",".join(str(d) for d in t.shape),
                "dtype": t.datatype}})


def _tensor_text(t) -> str:
    from .. import datatypes

    data = t.data
    if data is None or not isinstance(data, (bytes, bytearray, memoryview)):
        return ""
    try:
        if t.datatype == "BYTES":
            values = [v.decode("utf-8", "replace") for v in datatypes.deserialize_bytes(data)]
        else:
            import numpy as np

            values = np.frombuffer(data, dtype=datatypes.NUMPY_OF[t.datatype]).tolist()
    except (ValueError, KeyError):
        return ""
    return ",".join(str(v) for v in values)


def _check(settings: dict) -> dict:
    """Triton's setting names and value forms; every value is a string or a list of strings."""
    out: dict[str, list[str] | None] = {}
    for key, value in settings.items():
        if key not in DEFAULTS:
            raise invalid(f"unknown trace setting '{key}'; known: {', '.join(DEFAULTS)}")
        if value is None:  # clear: back to the global value
            out[key] = None
            continue
        values = value if isinstance(value, list) else [value]
        if not all(isinstance(v, str) for v in values):
            raise invalid(f"trace setting '{key}' takes strings")
        if key == "trace_level":
            for v in values:
                if v not in LEVELS:
                    raise invalid(f"trace level '{v}' is not supported here; use one of: {', '.join(LEVELS)}")
            out[key] = values
            continue
        if len(values) != 1:
            raise invalid(f"trace setting '{key}' takes one value")
        v = values[0]
        if key in ("trace_rate", "log_frequency") and not (v.isdigit() and (key == "log_frequency" or int(v) > 0)):
            raise invalid(f"trace setting '{key}' must be a {'positive' if key == 'trace_rate' else 'whole'} number")
        if key == "trace_count" and not (v == "-1" or v.isdigit()):
            raise invalid("trace setting 'trace_count' must be -1 (no limit) or a whole number")
        if key == "trace_mode" and v not in ("triton", "opentelemetry"):
            raise invalid(f"trace_mode must be 'triton' or 'opentelemetry', got '{v}'")
        out[key] = v
    return out


class Tracer:
    def __init__(self, settings: dict | None = None, otel_settings: dict[str, str] | None = None):
        self.global_settings = dict(DEFAULTS)
        self.global_settings.update({k: v for k, v in _check(settings or {}).items() if v is not None})
        # the mode is the server's, from its start: opentelemetry exports spans, triton writes the trace file
        self.mode = self.global_settings["trace_mode"]
        self.otel_settings = otel.check_settings(otel_settings or {}) if self.mode == "opentelemetry" else {}
        self.otel: otel.OtelExport | None = None  # made when the first span is
        self.startup = dict(self.global_settings)  # what a global setting cleared with null returns to
        self.model_settings: dict[str, dict] = {}
        self._seen: dict[str, int] = {}  # requests seen per setting scope, for the rate
        self._left: dict[str, int] = {}  # traces left per scope when trace_count is set
        self._ids = itertools.count(1)
        self._pending: dict[str, list[dict]] = {}  # trace file -> entries not yet written
        self._files_written: dict[str, int] = {}
        self._lock = threading.Lock()
        self.on = self._any_enabled()  # whether any request may be traced: sample() is None while not

    def _any_enabled(self) -> bool:
        """Whether any scope (global, or a model's) traces at all: when none does, sample() is a no-op."""
        for model in ["", *self.model_settings]:
            s = self.settings(model)
            if (s.get("trace_file") or self.mode == "opentelemetry") and any(level != "OFF"
                                                                             for level in s["trace_level"]):
                return True
        return False

    def settings(self, model: str = "") -> dict:
        """A scope's settings as Triton answers them: in opentelemetry mode, the mode's own settings
        take the place of the trace file's."""
        merged = dict(self.global_settings)
        merged.update(self.model_settings.get(model, {}))
        if self.mode == "opentelemetry":
            for key in ("trace_file", "log_frequency"):
                merged.pop(key, None)
            merged.update(self.otel_settings)
        return merged

    def update(self, changes: dict, model: str = "") -> dict:
        """Change the global settings or a model's. The trace file is the operator's choice alone
        (--trace-config file=...): refused over the network, as Triton does, even to reset it."""
        if "trace_file" in changes:
            raise unsupported("trace file location can not be updated through network protocol")
        if changes.get("trace_mode", self.mode) not in (self.mode, None):
            raise unsupported("trace mode can not be updated through network protocol")
        if any(key in otel.SETTINGS for key in changes):
            raise unsupported("opentelemetry settings can not be updated through network protocol")
        checked = _check(changes)
        self.flush()
        if model:
            scope = self.model_settings.setdefault(model, {})
            for key, value in checked.items():
                if value is None:
                    scope.pop(key, None)
                else:
                    scope[key] = value
        else:
            for key, value in checked.items():
                self.global_settings[key] = self.startup[key] if value is None else value
        self._seen.clear()
        self._left.clear()
        self.on = self._any_enabled()
        return self.settings(model)

    def sample(self, model: str, version: int, start_ns: int = 0, parent: Trace | dict | None = None,
               context: dict[str, str] | None = None) -> Trace | None:
        """A trace for this request when tracing is on for its model and the rate picks it. In
        opentelemetry mode, a request whose client sent its trace context (`context`: traceparent,
        tracestate), an ensemble's step of a traced request (`parent`, its Trace) or a BLS call made
        with a traced request's trace (`parent`, the W3C context of its span) is traced whatever the
        rate, as in Triton; its spans begin at `start_ns`."""
        if not self.on:
            return None
        s = self.settings(model)
        levels = tuple(level for level in s["trace_level"] if level != "OFF")
        if not levels or not (s.get("trace_file") or self.mode == "opentelemetry"):
            return None
        otel_mode = self.mode == "opentelemetry"
        if not (otel_mode and (parent is not None or context)) and not self._picked(model, s):
            return None
        trace = Trace(next(self._ids), model, version, levels=levels)
        if otel_mode:
            if self.otel is None:
                self.otel = otel.OtelExport(self.otel_settings)
            if isinstance(parent, dict):  # a BLS call: under its caller's span, with no InferRequest span
                trace.spans = self.otel.start(model, version, trace.id, start_ns or time.monotonic_ns(),
                                              None, parent, top=False)
            else:
                trace.spans = self.otel.start(model, version, trace.id, start_ns or time.monotonic_ns(),
                                              parent.spans if parent is not None and parent.spans else None,
                                              context, parent.id if parent is not None else 0)
        return trace

    def _picked(self, model: str, s: dict) -> bool:
        """Whether the rate and count pick this request of the model's scope."""
        scope = model if model in self.model_settings else ""
        seen = self._seen.get(scope, 0)
        self._seen[scope] = seen + 1
        if seen % int(s["trace_rate"]):
            return False
        if s["trace_count"] != "-1":
            left = self._left.setdefault(scope, int(s["trace_count"]))
            if left <= 0:
                return False
            self._left[scope] = left - 1
        return True

    def dropped_spans(self) -> int | None:
        """Spans dropped for a full export queue, in opentelemetry mode (None in the other)."""
        return None if self.mode != "opentelemetry" else self.otel.dropped if self.otel is not None else 0

    def finish(self, trace: Trace) -> None:
        if trace.spans is not None:
            assert self.otel is not None, "spans are begun by the export"
            self.otel.end(trace.spans, trace.timestamps)
            return
        s = self.settings(trace.model)
        entries = self._pending.setdefault(s["trace_file"], [])
        entries.append({"id": trace.id, "model_name": trace.model, "model_version": trace.version})
        entries += trace.tensors
        if "TIMESTAMPS" in trace.levels:
            entries.append({"id": trace.id, "timestamps": [{"name": n, "ns": ns} for n, ns in trace.timestamps]})
        frequency = int(s["log_frequency"])
        if frequency and len(entries) >= 2 * frequency:
            self._write(s["trace_file"], numbered=True)

    def _write(self, path: str, numbered: bool) -> None:
        entries = self._pending.pop(path, [])
        if not entries:
            return
        if numbered:
            index = self._files_written.get(path, 0)
            self._files_written[path] = index + 1
            target = f"{path}.{index}"
        else:
            target = path
        try:
            os.makedirs(os.path.dirname(os.path.abspath(target)), exist_ok=True)
            with open(target, "w") as f:
                json.dump(entries, f)
        except OSError as e:
            log.error("cannot write the trace file '%s': %s", target, e)

    def close(self) -> None:
        """At shutdown: write what is pending, and export the spans that wait."""
        self.flush()
        if self.otel is not None:
            self.otel.close()
            self.otel = None

    def flush(self) -> None:
        """Write what is pending (settings change, shutdown)."""
        for path in list(self._pending):
            numbered = any(int(self.settings(m)["log_frequency"]) for m in [""] + list(self.model_settings))
            self._write(path, numbered)


def settings_from_flags(trace_config: list[str]) -> tuple[dict, dict[str, str]]:
    """--trace-config values (Triton's `[triton,]KEY=VALUE`, `mode=MODE` and `opentelemetry,KEY=VALUE`)
    as settings: (the trace settings, the opentelemetry mode's; `resource` may be given several
    times, its pairs joined)."""
    names = {"file": "trace_file", "level": "trace_level", "rate": "trace_rate", "count": "trace_count",
             "log-frequency": "log_frequency", "log_frequency": "log_frequency", "mode": "trace_mode"}
    settings: dict = {}
    otel_settings: dict[str, str] = {}
    for item in trace_config:
        if item.startswith("opentelemetry,"):
            key, sep, value = item.split(",", 1)[1].partition("=")
            if not sep or key not in otel.SETTINGS:
                raise invalid(f"--trace-config '{item}': expected opentelemetry,KEY=VALUE with KEY one of "
                              f"{', '.join(otel.SETTINGS)}")
            if key == "resource" and "resource" in otel_settings:
                value = f"{otel_settings['resource']},{value}"
            otel_settings[key] = value
            continue
        text = item.split(",", 1)[1] if item.startswith("triton,") else item
        key, sep, value = text.partition("=")
        if not sep or key not in names:
            raise invalid(f"--trace-config '{item}': expected [triton,]KEY=VALUE with KEY one of "
                          f"{', '.join(sorted(set(names) - {'log_frequency'}))}, or opentelemetry,KEY=VALUE")
        name = names[key]
        if name == "trace_level":
            settings.setdefault("trace_level", [])
            if value.upper() != "OFF":
                settings["trace_level"].append(value.upper())
            elif not settings["trace_level"]:
                settings["trace_level"] = ["OFF"]
        else:
            settings[name] = value
    if otel_settings and settings.get("trace_mode") != "opentelemetry":
        raise invalid("--trace-config opentelemetry,... settings need --trace-config mode=opentelemetry")
    return settings, otel_settings
