"""What the Prometheus endpoint says: Triton's nv_* metrics (per model version, as --metrics-config
asks: the duration counters, summaries, the first-response histogram, the response cache's; CPU, and
GPU through NVML), plus tritonmp_* metrics Triton lacks (batch-size and request-duration histograms, queue
depth, in-flight requests, worker restarts, model load time, residency), and the metric families
python models define.

Everything is read at scrape time from the frontend's own counters (each served version's
ModelStats and figures), which workers' timings already reach through the result messages: no
second set of books and no multiprocess registry.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from ..lifecycle.model_manager import ModelManager
from ..metrics_config import MetricsConfig
from ..observability.exposition import Exposition, number
from ..observability.latency_metrics import FIRST_RESPONSE
from ..observability.stats import LATENCY_BUCKETS_US
from ..observability.system import SystemSampler, process_usage
from ..served import ServedVersion

FAILURE_REASONS = ("OTHER", "BACKEND", "CANCELED", "REJECTED")
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)

Samples = Callable[[ServedVersion], Iterable[tuple[float, dict[str, str]]]]  # (value, labels beyond its version's)


@dataclass(frozen=True)
class VersionMetric:
    """A family with one or more samples per served version."""

    name: str
    kind: str
    help: str
    samples: Samples


@dataclass(frozen=True)
class VersionHistogram:
    """A histogram per served version: its bucket counts (+Inf last) and the sum of what it counts."""

    name: str
    help: str
    bounds: tuple[float, ...]
    read: Callable[[ServedVersion], tuple[list[int], float]]


def _one(read: Callable[[ServedVersion], float]) -> Samples:
    return lambda mv: ((read(mv), {}),)


def _batch_sizes(mv: ServedVersion) -> tuple[list[int], float]:
    counts = [0] * (len(BATCH_BUCKETS) + 1)
    total = 0
    for size, entry in mv.stats.batches.items():
        slot = next((i for i, b in enumerate(BATCH_BUCKETS) if size <= b), len(BATCH_BUCKETS))
        counts[slot] += entry[0]
        total += size * entry[0]
    return counts, total


def _worker_usage(which: int) -> Samples:
    """One figure of process_usage (0: CPU seconds, 1: resident bytes) of each live instance's worker."""
    def samples(mv: ServedVersion) -> Iterable[tuple[float, dict[str, str]]]:
        for instance in mv.instances():
            usage = process_usage(instance.pid) if instance.pid is not None else None
            if usage is not None:
                yield (round(usage[0], 3) if which == 0 else usage[1]), {"instance": instance.name}
    return samples


# Triton's, in the order Triton exports them: counts, the duration counters (unless counter_latencies is
# off), the response cache's (of versions whose config enables it), pending requests
TRITON_COUNTS = [
    VersionMetric("nv_inference_request_success", "counter", "Number of successful inference requests, all batch sizes",
                  _one(lambda mv: mv.stats.counts["success"])),
    VersionMetric("nv_inference_request_failure", "counter", "Number of failed inference requests, all batch sizes",
                  lambda mv: ((mv.stats.failures.get(r, 0), {"reason": r}) for r in FAILURE_REASONS)),
    VersionMetric("nv_inference_count", "counter",
                  "Number of inferences performed (does not include cached requests)",
                  _one(lambda mv: mv.stats.inference_count)),
    VersionMetric("nv_inference_exec_count", "counter",
                  "Number of model executions performed (does not include cached requests)",
                  _one(lambda mv: mv.stats.execution_count)),
]
TRITON_DURATIONS = [
    VersionMetric("nv_inference_request_duration_us", "counter",
                  "Cumulative inference request duration in microseconds (includes cached requests)",
                  _one(lambda mv: (mv.stats.ns["success"] + mv.stats.ns["fail"]) // 1000)),
    VersionMetric("nv_inference_queue_duration_us", "counter",
                  "Cumulative inference queuing duration in microseconds (includes cached requests)",
                  _one(lambda mv: mv.stats.ns["queue"] // 1000)),
    VersionMetric("nv_inference_compute_input_duration_us", "counter",
                  "Cumulative compute input duration in microseconds (does not include cached requests)",
                  _one(lambda mv: mv.stats.ns["compute_input"] // 1000)),
    VersionMetric("nv_inference_compute_infer_duration_us", "counter",
                  "Cumulative compute inference duration in microseconds (does not include cached requests)",
                  _one(lambda mv: mv.stats.ns["compute_infer"] // 1000)),
    VersionMetric("nv_inference_compute_output_duration_us", "counter",
                  "Cumulative inference compute output duration in microseconds (does not include cached requests)",
                  _one(lambda mv: mv.stats.ns["compute_output"] // 1000)),
]
TRITON_CACHE = [
    VersionMetric("nv_cache_num_hits_per_model", "counter", "Number of cache hits per model",
                  _one(lambda mv: mv.stats.counts["cache_hit"])),
    VersionMetric("nv_cache_hit_duration_per_model", "counter", "Total cache hit duration per model, in microseconds",
                  _one(lambda mv: mv.stats.ns["cache_hit"] // 1000)),
    VersionMetric("nv_cache_num_misses_per_model", "counter", "Number of cache misses per model",
                  _one(lambda mv: mv.stats.counts["cache_miss"])),
    VersionMetric("nv_cache_miss_duration_per_model", "counter",
                  "Total cache miss (insert+lookup) duration per model, in microseconds",
                  _one(lambda mv: mv.stats.ns["cache_miss"] // 1000)),
]
TRITON_PENDING = [
    VersionMetric("nv_inference_pending_request_count", "gauge",
                  "Instantaneous number of pending requests awaiting execution per-model.",
                  _one(lambda mv: mv.queued())),
]
# --metrics-config summary_latencies=true: (family, help, the LatencyRecorder's summary), in Triton's order and
# words (its compute summaries' help is its counters')
TRITON_SUMMARIES = [
    ("nv_inference_request_summary_us",
     "Summary of inference request duration in microseconds (includes cached requests)", "request"),
    ("nv_inference_queue_summary_us",
     "Summary of inference queuing duration in microseconds (includes cached requests)", "queue"),
    ("nv_inference_compute_input_summary_us",
     "Cumulative compute input duration in microseconds (does not include cached requests)", "compute_input"),
    ("nv_inference_compute_infer_summary_us",
     "Cumulative compute inference duration in microseconds (does not include cached requests)", "compute_infer"),
    ("nv_inference_compute_output_summary_us",
     "Cumulative inference compute output duration in microseconds (does not include cached requests)",
     "compute_output"),
    ("nv_cache_hit_summary_per_model", "Summary of cache hit counts/durations per model, in microseconds.",
     "cache_hit"),
    ("nv_cache_miss_summary_per_model", "Summary of cache miss counts/durations per model, in microseconds.",
     "cache_miss"),
]
CACHED_SUMMARIES = {"cache_hit", "cache_miss"}  # kept only for versions whose config enables the response cache

# what Triton users keep asking for
HISTOGRAMS = [
    VersionHistogram("tritonmp_batch_size", "Batch sizes the model executed (rows per execution)", BATCH_BUCKETS,
                     _batch_sizes),
    VersionHistogram("tritonmp_request_duration_us",
                     "Duration of requests from their arrival in the queue to their response, in microseconds",
                     LATENCY_BUCKETS_US,
                     lambda mv: (mv.stats.latency_buckets, (mv.stats.ns["success"] + mv.stats.ns["fail"]) / 1000)),
    VersionHistogram("tritonmp_queue_duration_us",
                     "Time requests waited in the model's queue before execution, in microseconds", LATENCY_BUCKETS_US,
                     lambda mv: (mv.stats.queue_buckets, mv.stats.ns["queue"] / 1000)),
]

TRITONMP_METRICS = [
    VersionMetric("tritonmp_queue_depth", "gauge", "Requests waiting in the model's queue",
                  _one(lambda mv: mv.queued())),
    VersionMetric("tritonmp_inflight_requests", "gauge", "Requests executing on the model's instances",
                  _one(lambda mv: mv.in_flight())),
    VersionMetric("tritonmp_worker_restarts_total", "counter", "Worker processes of the model restarted after dying",
                  _one(lambda mv: mv.restarts())),
    VersionMetric("tritonmp_model_load_duration_seconds", "gauge", "How long the model version took to load",
                  _one(lambda mv: round(mv.load_seconds, 6))),
    VersionMetric("tritonmp_worker_cpu_seconds_total", "counter", "CPU time used by the worker process of an instance",
                  _worker_usage(0)),
    VersionMetric("tritonmp_worker_resident_memory_bytes", "gauge",
                  "Resident memory of the worker process of an instance", _worker_usage(1)),
]

GPU_METRICS = {
    "nv_gpu_utilization": ("gauge", "GPU utilization rate [0.0 - 1.0)"),
    "nv_gpu_memory_total_bytes": ("gauge", "GPU total memory, in bytes"),
    "nv_gpu_memory_used_bytes": ("gauge", "GPU used memory, in bytes"),
    "nv_gpu_power_usage": ("gauge", "GPU power usage in watts"),
    "nv_gpu_power_limit": ("gauge", "GPU power management limit in watts"),
    "nv_energy_consumption": ("counter", "GPU energy consumption in joules since the Triton Server started"),
}


def model_labels(name: str, namespace: str, version: str) -> dict[str, str]:
    """A model version's labels, as Triton's: its namespace only with --model-namespacing."""
    if namespace:
        return {"model": name, "namespace": namespace, "version": version}
    return {"model": name, "version": version}


def _per_version(out: Exposition, metrics: list[VersionMetric], versions: list[ServedVersion]) -> None:
    for metric in metrics:
        out.family(metric.name, metric.kind, metric.help)
        for mv in versions:
            for value, labels in metric.samples(mv):
                out.sample(metric.name, value, **model_labels(mv.name, mv.namespace, str(mv.version)), **labels)


def _summaries(out: Exposition, versions: list[ServedVersion], config: MetricsConfig) -> None:
    """Triton's latency summaries: for each family, the versions that keep it (a family none keeps is
    left out, as Triton leaves it)."""
    now = time.monotonic()
    for name, help_text, kind in TRITON_SUMMARIES:
        kept = [(mv, mv.stats.latency.summaries[kind]) for mv in versions
                if mv.stats.latency is not None and kind in mv.stats.latency.summaries
                and (kind not in CACHED_SUMMARIES or mv.config.response_cache.enable)]
        if not kept:
            continue
        out.family(name, "summary", help_text)
        for mv, summary in kept:
            labels = model_labels(mv.name, mv.namespace, str(mv.version))
            out.sample(f"{name}_count", summary.count, **labels)
            out.sample(f"{name}_sum", summary.total, **labels)
            for (q, _), value in zip(config.summary_quantiles, summary.quantiles(config.summary_quantiles, now)):
                out.sample(name, "NaN" if math.isnan(value) else value, **labels, quantile=str(number(q)))


def _first_response(out: Exposition, versions: list[ServedVersion]) -> None:
    """nv_inference_first_response_histogram_ms (--metrics-config histogram_latencies=true)."""
    kept = [mv for mv in versions if mv.stats.latency is not None and mv.stats.latency.first_counts]
    if not kept:
        return
    out.family(FIRST_RESPONSE, "histogram", "Duration from request to first response in milliseconds")
    for mv in kept:
        latency = mv.stats.latency
        assert latency is not None
        out.histogram(FIRST_RESPONSE, latency.buckets_ms, latency.first_counts, latency.first_sum_ms,
                      **model_labels(mv.name, mv.namespace, str(mv.version)))


def _residency(out: Exposition, models: ModelManager) -> None:
    """The models loaded on demand (--load-on-demand), where they are."""
    residency = models.residency
    if residency is not None:  # --load-on-demand
        out.family("tritonmp_model_resident", "gauge", "1 for each model loaded on demand and resident now")
        for name in residency.lru:
            out.sample("tritonmp_model_resident", 1, model=name)
        out.family("tritonmp_resident_models", "gauge", "Models resident now (--load-on-demand)")
        out.sample("tritonmp_resident_models", len(residency.lru))
        out.family("tritonmp_resident_memory_bytes", "gauge",
                   "Memory (PSS) of the resident models' workers, as measured when each loaded")
        out.sample("tritonmp_resident_memory_bytes", residency.memory_bytes)
        out.family("tritonmp_model_loads_on_demand_total", "counter", "Models loaded because a request asked for them")
        out.sample("tritonmp_model_loads_on_demand_total", residency.loads)
        out.family("tritonmp_model_evictions_total", "counter",
                   "Models unloaded to keep within --max-resident-models or --max-resident-memory-mb")
        out.sample("tritonmp_model_evictions_total", residency.evictions)


def render(models: ModelManager, system: SystemSampler, dropped_spans: int | None = None) -> bytes:
    """The whole exposition text, read from the live model versions. `dropped_spans`: OpenTelemetry
    spans dropped for a full export queue (None where spans are not exported)."""
    versions = [mv for e in models.models.values() for _, mv in sorted(e.versions.items())]
    config = models.settings.metrics
    out = Exposition()
    _per_version(out, TRITON_COUNTS, versions)
    if config.counter_latencies:
        _per_version(out, TRITON_DURATIONS, versions)
    cached = [mv for mv in versions if mv.config.response_cache.enable]
    if cached:
        _per_version(out, TRITON_CACHE, cached)
    _per_version(out, TRITON_PENDING, versions)
    if config.summary_latencies:
        _summaries(out, versions, config)
    if config.histogram_latencies:
        _first_response(out, versions)
    if system.cpu:
        out.family("nv_cpu_utilization", "gauge", "CPU utilization rate [0.0 - 1.0]")
        out.sample("nv_cpu_utilization", system.cpu_utilization)
        out.family("nv_cpu_memory_total_bytes", "gauge", "CPU total memory (RAM), in bytes")
        out.sample("nv_cpu_memory_total_bytes", system.memory[0])
        out.family("nv_cpu_memory_used_bytes", "gauge", "CPU used memory (RAM), in bytes")
        out.sample("nv_cpu_memory_used_bytes", system.memory[1])
    if system.gpu_values:
        for metric, (kind, help_text) in GPU_METRICS.items():
            out.family(metric, kind, help_text)
            for _, values in sorted(system.gpu_values.items()):
                out.sample(metric, values[metric], gpu_uuid=values["uuid"])
    for h in HISTOGRAMS:
        out.family(h.name, "histogram", h.help)
        for mv in versions:
            counts, total = h.read(mv)
            out.histogram(h.name, h.bounds, counts, total, **model_labels(mv.name, mv.namespace, str(mv.version)))
    out.family("tritonmp_model_ready", "gauge",
               "1 when the model version is READY, 0 when it is loading, unloading or unavailable (a model "
               "that failed to load has version \"\"; models unloaded on purpose are not listed)")
    for _, entry in sorted(models.models.items()):
        for version, mv in sorted(entry.versions.items()):
            out.sample("tritonmp_model_ready", int(mv.state == "READY"),
                       **model_labels(entry.name, entry.namespace, str(version)))
        if entry.problem and not entry.versions:
            out.sample("tritonmp_model_ready", 0, **model_labels(entry.name, entry.namespace, ""))
    _residency(out, models)
    _per_version(out, TRITONMP_METRICS, versions)
    if dropped_spans is not None:
        out.family("tritonmp_trace_spans_dropped_total", "counter",
                   "OpenTelemetry spans dropped because the export queue was full (bsp_max_queue_size) or the "
                   "receiver failed")
        out.sample("tritonmp_trace_spans_dropped_total", dropped_spans)
    usage = process_usage(os.getpid())  # the frontend, under the names every Prometheus client uses
    if usage is not None:
        out.family("process_cpu_seconds_total", "counter", "Total user and system CPU time spent in seconds")
        out.sample("process_cpu_seconds_total", round(usage[0], 3))
        out.family("process_resident_memory_bytes", "gauge", "Resident memory size in bytes")
        out.sample("process_resident_memory_bytes", usage[1])
    models.services.custom_metrics.render(out)  # python models' own (pb_utils.MetricFamily)
    return ("\n".join(out.lines) + "\n").encode()
