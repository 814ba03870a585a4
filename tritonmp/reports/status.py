"""The live status of the server as one JSON document (`/status.json` on the metrics port), and the
history behind its rates: what the status page (status_page.html) shows, and what scripts read.

Everything comes from the counters the metrics are rendered from (each served version's ModelStats
and figures, the shared-memory registry); `StatusHistory` samples them once a second and keeps the last five
minutes, from which requests and failures per second and p50/p99 latency are computed (quantiles
from the request-duration histogram, interpolated within a bucket as Prometheus does).
"""

from __future__ import annotations

import asyncio
import os
import time
from collections import deque

from .. import __version__
from ..ipc.shm_registry import SharedMemoryRegistry
from ..lifecycle.model_manager import ModelManager
from ..observability.stats import LATENCY_BUCKETS_US, ModelStats
from ..observability.system import SystemSampler
from ..served import InstanceSnapshot, ServedVersion

SAMPLE_SECONDS = 1.0
HISTORY_SECONDS = 300
WINDOW_SECONDS = 60  # the span of the rates and quantiles shown beside each model
SERIES_STEP = 5  # samples per point of the history sent
_FIGURES = ("requests_per_s", "failures_per_s", "p50_us", "p99_us")


def quantile(q: float, counts: list[int]) -> float | None:
    """The q-quantile (microseconds) of a request-duration histogram's bucket counts (the last one
    +Inf); None when it is empty."""
    total = sum(counts)
    if total <= 0:
        return None
    rank = q * total
    seen = 0
    for i, count in enumerate(counts):
        if count and seen + count >= rank:
            if i == len(LATENCY_BUCKETS_US):  # past the last bound: that bound is all we know
                return float(LATENCY_BUCKETS_US[-1])
            low = LATENCY_BUCKETS_US[i - 1] if i else 0.0
            return low + (LATENCY_BUCKETS_US[i] - low) * (rank - seen) / count
        seen += count
    return float(LATENCY_BUCKETS_US[-1])


class _Sample:
    __slots__ = ("at", "success", "failure", "buckets")

    def __init__(self, at: float, stats: ModelStats | None = None):
        self.at = at
        if stats is None:  # where a version's counters start
            self.success = self.failure = 0
            self.buckets = (0,) * (len(LATENCY_BUCKETS_US) + 1)
        else:
            self.success = stats.counts["success"]
            self.failure = stats.counts["fail"]
            self.buckets = tuple(stats.latency_buckets)


def _rates(old: _Sample, new: _Sample) -> dict:
    span = max(new.at - old.at, 1e-9)
    delta = [b - a for a, b in zip(old.buckets, new.buckets)]
    p50, p99 = quantile(0.5, delta), quantile(0.99, delta)
    return {"requests_per_s": round((new.success - old.success) / span, 3),
            "failures_per_s": round((new.failure - old.failure) / span, 3),
            "p50_us": None if p50 is None else round(p50, 1), "p99_us": None if p99 is None else round(p99, 1)}


class StatusHistory:
    """Samples of every model version's counters, the last HISTORY_SECONDS of them."""

    def __init__(self, models: ModelManager):
        self.models = models
        self.samples: dict[tuple[str, str, int], deque[_Sample]] = {}  # (namespace, name, version) ->
        self.started = time.time()

    def sample(self) -> None:
        now = time.time()
        live = set()
        for entry in self.models.models.values():
            for mv in entry.versions.values():
                key = (mv.namespace, mv.name, mv.version)
                live.add(key)
                history = self.samples.get(key)
                if history is None or history[-1].success > mv.stats.counts["success"]:  # new, or reloaded
                    history = self.samples[key] = deque(maxlen=int(HISTORY_SECONDS / SAMPLE_SECONDS) + 1)
                    history.append(_Sample(now - SAMPLE_SECONDS))  # its counters began at zero since the last look
                history.append(_Sample(now, mv.stats))
        for key in set(self.samples) - live:  # unloaded
            del self.samples[key]

    async def run(self) -> None:
        while True:
            self.sample()
            await asyncio.sleep(SAMPLE_SECONDS)

    def series(self, mv: ServedVersion) -> tuple[dict, dict]:
        """The rates over the last WINDOW_SECONDS, and the history in SERIES_STEP-sample steps (one
        list per figure, oldest first)."""
        history = list(self.samples.get((mv.namespace, mv.name, mv.version), ()))
        now = _Sample(time.time(), mv.stats)
        if not history:  # loaded since the last sample: its counters began at zero since then at most
            start = _Sample(max(self.started, now.at - SAMPLE_SECONDS))
            empty: dict[str, list] = {"t": [], **{k: [] for k in _FIGURES}}
            return {"seconds": round(now.at - start.at, 1), **_rates(start, now)}, empty
        start = next((s for s in history if now.at - s.at <= WINDOW_SECONDS), history[-1])
        window = {"seconds": round(now.at - start.at, 1), **_rates(start, now)}
        steps = history[(len(history) - 1) % SERIES_STEP::SERIES_STEP]  # ends at the newest sample
        rates = [_rates(a, b) for a, b in zip(steps, steps[1:])]
        series = {"t": [round(b.at, 1) for b in steps[1:]], **{k: [r[k] for r in rates] for k in _FIGURES}}
        return window, series


def _instance(i: InstanceSnapshot) -> dict:
    return {"name": i.name, "kind": i.kind, "device": i.device_id if i.kind == "GPU" else None, "pid": i.pid,
            "alive": i.alive, "busy": i.busy, "restarts": i.restarts, "last_error": i.last_exit or None,
            "gave_up": i.gave_up, "up_s": round(i.up_s, 1) if i.up_s is not None else None, "cores": i.cores or None}


def _version(mv: ServedVersion, history: StatusHistory) -> dict:
    s = mv.stats
    window, points = history.series(mv)
    batches = {str(size): entry[0] for size, entry in sorted(s.batches.items())}
    return {"name": mv.name, "namespace": mv.namespace or None, "version": str(mv.version), "state": mv.state,
            "reason": mv.reason or None,
            "backend": mv.backend, "max_batch_size": mv.max_batch_size,
            "instances": [_instance(i) for i in mv.instances()],
            "requests": {"success": s.counts["success"], "failure": s.counts["fail"],
                         "failure_reasons": dict(s.failures), "inferences": s.inference_count,
                         "executions": s.execution_count},
            "queue_depth": mv.queued(), "in_flight": mv.in_flight(), "worker_restarts": mv.restarts(),
            "load_seconds": round(mv.load_seconds, 3),
            "batch_sizes": batches, "window": window, "series": points}


def status(models: ModelManager, shm: SharedMemoryRegistry, started: float, loaded: bool, system: SystemSampler,
           history: StatusHistory) -> dict:
    """The whole status document: the models, the clients' shared-memory regions, the server started
    at `started` (its startup load done when `loaded`), the machine."""
    settings = models.settings
    rows = []
    shown = set()
    for _, entry in sorted(models.models.items()):
        for _, mv in sorted(entry.versions.items()):
            rows.append(_version(mv, history))
            shown.add((mv.namespace or None, mv.name, str(mv.version)))
    for row in models.index(namespaces=True):  # what has no live version: unloaded, failed to load, not loaded yet
        namespace = row.get("namespace")
        if (namespace, row["name"], row.get("version")) not in shown and "state" in row:
            rows.append({"name": row["name"], "namespace": namespace, "version": row.get("version"),
                         "state": row["state"], "reason": row.get("reason"), "instances": []})
    rows.sort(key=lambda r: (r["name"], r["namespace"] or "",
                             int(r["version"]) if (r.get("version") or "").isdigit() else -1))
    regions = [{"name": r.name, "kind": r.kind, "key": r.key or None, "offset": r.offset, "byte_size": r.byte_size,
                "device_id": r.device_id if r.kind == "cuda" else None}
               for r in sorted(shm.regions.values(), key=lambda r: r.name)]
    gpus = [{"index": index, "uuid": values["uuid"], "utilization": values["nv_gpu_utilization"],
             "memory_used_bytes": values["nv_gpu_memory_used_bytes"],
             "memory_total_bytes": values["nv_gpu_memory_total_bytes"]}
            for index, values in sorted(system.gpu_values.items())]
    return {"server": {"id": settings.server_id, "version": __version__, "pid": os.getpid(),
                       "started": round(started, 3), "uptime_s": round(time.time() - started, 1),
                       "ready": bool(loaded and models.all_ready()),
                       "model_control": settings.model_control, "flags": settings.flags},
            "system": {"cpu_utilization": round(system.cpu_utilization, 4) if system.cpu else None,
                       "memory_total_bytes": system.memory[0] if system.cpu else None,
                       "memory_used_bytes": system.memory[1] if system.cpu else None, "gpus": gpus},
            "models": rows, "shared_memory": regions, "window_seconds": WINDOW_SECONDS,
            "residency": models.residency_summary()}
