"""Custom metrics that python models define with `pb_utils.MetricFamily` and `Metric`.

Their values live here, in the frontend, and are exported on the metrics endpoint beside the
server's own. Living here, they survive a worker's restart: the restarted model creates its families
and metrics again in `initialize`, finds the values it had, and counts on from them (nothing is
replayed, so nothing is counted twice). A model's metrics go when the model version that created
them is unloaded, or when the model deletes them (its Python objects are released).
"""

from __future__ import annotations

import bisect
import math
import re
from collections import Counter
from dataclasses import dataclass, field

from ..errors import ServerError, Status
from .exposition import number

KINDS = ("COUNTER", "GAUGE", "HISTOGRAM")
_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*\Z")
_LABEL = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*\Z")
RESERVED_PREFIXES = ("nv_", "tritonmp_")  # the server's own families


def _invalid(message: str) -> ServerError:
    return ServerError(message, Status.INVALID_ARG)


@dataclass
class _Metric:
    labels: tuple[tuple[str, str], ...]
    buckets: tuple[float, ...] = ()
    value: float = 0.0
    counts: list[int] = field(default_factory=list)  # histograms: per bucket, then +Inf
    total: float = 0.0
    refs: Counter = field(default_factory=Counter)  # worker pid -> Metric objects it holds
    owners: set = field(default_factory=set)  # the model versions that created it


@dataclass
class _Family:
    name: str
    description: str
    kind: str
    metrics: dict[tuple, _Metric] = field(default_factory=dict)
    refs: Counter = field(default_factory=Counter)
    owners: set = field(default_factory=set)


class CustomMetrics:
    def __init__(self) -> None:
        self.families: dict[str, _Family] = {}

    # -- what the models ask -----------------------------------------------------------------
    def family_new(self, name: str, description: str, kind: str, owner: object, pid: int) -> None:
        """`owner` stands for the model version (its pool): what it created goes when it is unloaded."""
        if kind not in KINDS:
            raise _invalid(f"Error when creating MetricFamily: unknown metric kind '{kind}'; use "
                           "pb_utils.MetricFamily.COUNTER, GAUGE or HISTOGRAM")
        if not _NAME.match(name or ""):
            raise _invalid(f"Error when creating MetricFamily: '{name}' is not a valid metric name "
                           "([a-zA-Z_:][a-zA-Z0-9_:]*)")
        if name.startswith(RESERVED_PREFIXES):
            raise _invalid(f"Error when creating MetricFamily: the names starting with "
                           f"{' or '.join(RESERVED_PREFIXES)} belong to the server's own metrics ('{name}')")
        family = self.families.get(name)
        if family is None:
            family = self.families[name] = _Family(name, description, kind)
        elif family.kind != kind:  # the same name and kind is the same family, whatever its description
            raise ServerError(f"Error when creating MetricFamily: a metric family '{name}' already exists with "
                              f"kind {family.kind} and description '{family.description}'", Status.ALREADY_EXISTS)
        family.refs[pid] += 1
        family.owners.add(owner)

    def metric_new(self, name: str, labels: dict, buckets: list[float] | None, owner: object, pid: int) -> None:
        family = self._family(name, "Error when creating Metric")
        for key, value in labels.items():
            if not isinstance(key, str) or not _LABEL.match(key) or not isinstance(value, str):
                raise _invalid(f"Error when creating Metric: label {key!r}: {value!r} is not a valid label "
                               "(names [a-zA-Z_][a-zA-Z0-9_]*, values strings)")
        if family.kind == "HISTOGRAM":
            if buckets is None:  # an empty list is a histogram of the +Inf bucket alone, as in Triton
                raise _invalid("Error when creating Metric: a HISTOGRAM metric needs buckets")
            if any(not math.isfinite(b) for b in buckets) or list(buckets) != sorted(set(buckets)):
                raise _invalid(f"Error when creating Metric: histogram buckets must be finite and increasing, "
                               f"got {list(buckets)}")
        elif buckets:
            raise _invalid(f"Error when creating Metric: buckets are only for HISTOGRAM metrics, and "
                           f"'{name}' is a {family.kind}")
        key = tuple(sorted(labels.items()))
        metric = family.metrics.get(key)
        if metric is None:
            metric = family.metrics[key] = _Metric(key, tuple(buckets or ()))
            if buckets is not None:
                metric.counts = [0] * (len(buckets) + 1)
        elif buckets is not None and tuple(buckets) != metric.buckets:
            raise _invalid(f"Error when creating Metric: the metric {dict(key)} of '{name}' already exists with "
                           f"buckets {list(metric.buckets)}")
        metric.refs[pid] += 1
        metric.owners.add(owner)

    def update(self, op: str, name: str, labels: dict, value: float) -> None:
        """increment, set or observe; checked in the worker first, so that the model sees its errors."""
        family = self.families.get(name)
        metric = family.metrics.get(tuple(sorted(labels.items()))) if family is not None else None
        if metric is None:
            return  # deleted (or its model unloaded) while the update was on its way
        if op == "observe":
            metric.counts[bisect.bisect_left(metric.buckets, value)] += 1
            metric.total += value
        elif op == "set":
            metric.value = value
        else:
            metric.value += value

    def value(self, name: str, labels: dict) -> float:
        family = self._family(name, "Failed to get metric value")
        metric = family.metrics.get(tuple(sorted(labels.items())))
        if metric is None:
            raise ServerError(f"Failed to get metric value: the metric {labels} of '{name}' has been deleted",
                              Status.NOT_FOUND)
        return metric.value

    def delete(self, name: str, labels: dict | None, pid: int) -> None:
        """A model released a Metric (labels) or a MetricFamily (None) object: removed with the last
        one that any live worker holds."""
        family = self.families.get(name)
        if family is None:
            return
        refs = family.refs if labels is None else getattr(family.metrics.get(tuple(sorted(labels.items()))),
                                                            "refs", None)
        if refs is None or refs[pid] <= 0:
            return
        refs[pid] -= 1
        if sum(refs.values()):
            return
        if labels is None:
            del self.families[name]
        else:
            del family.metrics[tuple(sorted(labels.items()))]

    # -- what the server does ----------------------------------------------------------------
    def worker_gone(self, pid: int) -> None:
        """A worker has died or stopped: its holds go, its metrics stay (a restart finds them)."""
        for family in self.families.values():
            family.refs.pop(pid, None)
            for metric in family.metrics.values():
                metric.refs.pop(pid, None)

    def drop_owner(self, owner: object) -> None:
        """A model version is unloaded: what it created goes with it, unless another model version
        (another model, or the version that replaces it) created the same too."""
        for name, family in list(self.families.items()):
            for key, metric in list(family.metrics.items()):
                metric.owners.discard(owner)
                if not metric.owners:
                    del family.metrics[key]
            family.owners.discard(owner)
            if not family.owners and not family.metrics:
                del self.families[name]

    def _family(self, name: str, context: str) -> _Family:
        family = self.families.get(name)
        if family is None:
            raise ServerError(f"{context}: the metric family '{name}' has been deleted", Status.NOT_FOUND)
        return family

    def render(self, out) -> None:
        """Every custom family in the text format, through exposition.Exposition."""
        for family in self.families.values():
            kind = family.kind.lower()
            out.family(family.name, kind, family.description)
            for metric in family.metrics.values():
                labels = dict(metric.labels)
                if family.kind == "HISTOGRAM":
                    out.histogram(family.name, metric.buckets, metric.counts, metric.total, **labels)
                else:
                    out.sample(family.name, number(metric.value), **labels)
