"""The custom-metrics part of Triton's python-backend API: `MetricFamily`, `Metric`, `MetricKind`.

Values live in the frontend (tritonmp/observability/custom_metrics.py), which exports them with the server's own
metrics. Creating a family or a metric, and reading a value, ask the frontend and wait; increment,
set and observe are checked here and sent without waiting (in order with everything else the worker
sends), so that a model may count on its hot path.
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Callable
from typing import Any


class MetricKind(enum.IntEnum):
    COUNTER = 0
    GAUGE = 1
    HISTOGRAM = 2


class _StandIn(Exception):
    """Stands for pb_utils.TritonModelException, set by pb_utils (which imports this module)."""


_ModelError: type[Exception] = _StandIn  # pb_utils.TritonModelException, once pb_utils is imported


# Set by the worker: call(op, args) -> float asks the frontend and waits; send(op, family, labels, value)
# does not wait.
def _outside_a_worker(*_args: Any) -> Any:
    raise _ModelError("custom metrics are only available to a model served by tritonmp")


_call: Callable[[str, dict], float] = _outside_a_worker
_send: Callable[[str, str, dict, float], None] = _outside_a_worker
# deletions of released objects, sent by the worker with its next message (never from __del__ itself,
# which may run in the middle of another send)
outbox: deque = deque()


def _ask(op: str, context: str, **args) -> float:
    if _call is None:
        raise _ModelError(f"{context}: custom metrics are only available in a model served by tritonmp")
    return _call(op, args)


class MetricFamily:
    """A family of metrics of one kind, created in initialize(), execute() or finalize()."""

    COUNTER = MetricKind.COUNTER
    GAUGE = MetricKind.GAUGE
    HISTOGRAM = MetricKind.HISTOGRAM

    def __init__(self, name: str, description: str, kind: MetricKind):
        try:
            kind = MetricKind(kind)
        except ValueError:
            raise _ModelError("Error when creating MetricFamily: Unknown metric kind") from None
        self._name, self._kind = str(name), kind
        self._state = {"deleted": False}  # shared with its metrics
        _ask("metric_family_new", "Error when creating MetricFamily", name=self._name, description=str(description),
             kind=kind.name)
        self._created = True

    def Metric(self, labels: dict | None = None, buckets: list[float] | None = None) -> Metric:  # noqa: N802
        return Metric(self, labels, buckets)

    def __del__(self):
        if getattr(self, "_created", False):
            self._state["deleted"] = True
            outbox.append(("delete_family", self._name, {}))


class Metric:
    """One metric (one set of labels) of a family: increment, set, observe, value."""

    def __init__(self, family: MetricFamily, labels: dict | None, buckets: list[float] | None):
        labels = dict(labels or {})
        for key, value in labels.items():
            if not isinstance(key, str) or not isinstance(value, str):
                raise _ModelError(f"Error when creating Metric: labels must map strings to strings, got "
                                  f"{key!r}: {value!r}")
        self._family, self._kind, self._state = family._name, family._kind, family._state
        self._labels = labels
        self._check("Error when creating Metric")
        _ask("metric_new", "Error when creating Metric", family=self._family, labels=labels,
             buckets=None if buckets is None else [float(b) for b in buckets])
        self._created = True

    def _check(self, context: str, op: str = "", allowed: tuple = ()) -> None:
        if self._state["deleted"]:
            raise _ModelError(f"{context}: Invalid metric operation as the corresponding 'MetricFamily' has been "
                              "deleted. The 'MetricFamily' object should be deleted AFTER its corresponding "
                              "'Metric' objects have been deleted.")
        if op and self._kind not in allowed:
            raise _ModelError(f"{context}: TRITONSERVER_METRIC_KIND_{self._kind.name} does not support {op}")

    def increment(self, value: float) -> None:
        context = "Failed to increment metric value"
        self._check(context, "Increment", (MetricKind.COUNTER, MetricKind.GAUGE))
        if self._kind == MetricKind.COUNTER and value < 0:
            raise _ModelError(f"{context}: TRITONSERVER_METRIC_KIND_COUNTER can only be incremented by a "
                              f"non-negative value, got {value}")
        _send("increment", self._family, self._labels, float(value))

    def set(self, value: float) -> None:
        self._check("Failed to set metric value", "Set", (MetricKind.GAUGE,))
        _send("set", self._family, self._labels, float(value))

    def observe(self, value: float) -> None:
        self._check("Failed to observe metric value", "Observe", (MetricKind.HISTOGRAM,))
        _send("observe", self._family, self._labels, float(value))

    def value(self) -> float:
        context = "Failed to get metric value"
        self._check(context, "Value", (MetricKind.COUNTER, MetricKind.GAUGE))
        return _ask("metric_value", context, family=self._family, labels=self._labels)

    def __del__(self):
        if getattr(self, "_created", False) and not self._state["deleted"]:
            outbox.append(("delete", self._family, self._labels))
