"""The Prometheus endpoint: Triton's nv_* metrics (per model version, CPU, and GPU through NVML),
plus tritonmp_* metrics Triton lacks (batch-size and request-duration histograms, queue depth,
in-flight requests, worker restarts, model load time), and the metric families python models define.

Everything is read at scrape time from the frontend's own counters (ModelStats, schedulers,
pools), which workers' timings already reach through the result messages: no second set of
books and no multiprocess registry. Triton exposes its counters without a `_total` suffix, so
this module writes the text format itself rather than through prometheus_client's Counter.
"""

from __future__ import annotations

import asyncio
import functools
import os
from pathlib import Path

import orjson
from prometheus_client import CONTENT_TYPE_LATEST

from ..logs import get_logger
from .stats import LATENCY_BUCKETS_US
from .status import StatusHistory
from .status import status as status_document

log = get_logger("metrics")

FAILURE_REASONS = ("OTHER", "BACKEND", "CANCELED", "REJECTED")
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)

_MODEL_METRICS = [
    ("nv_inference_request_success", "counter", "Number of successful inference requests, all batch sizes"),
    ("nv_inference_request_failure", "counter", "Number of failed inference requests, all batch sizes"),
    ("nv_inference_count", "counter", "Number of inferences performed (does not include cached requests)"),
    ("nv_inference_exec_count", "counter", "Number of model executions performed (does not include cached requests)"),
    ("nv_inference_request_duration_us", "counter",
     "Cumulative inference request duration in microseconds (includes cached requests)"),
    ("nv_inference_queue_duration_us", "counter",
     "Cumulative inference queuing duration in microseconds (includes cached requests)"),
    ("nv_inference_compute_input_duration_us", "counter",
     "Cumulative compute input duration in microseconds (does not include cached requests)"),
    ("nv_inference_compute_infer_duration_us", "counter",
     "Cumulative compute inference duration in microseconds (does not include cached requests)"),
    ("nv_inference_compute_output_duration_us", "counter",
     "Cumulative inference compute output duration in microseconds (does not include cached requests)"),
    ("nv_inference_pending_request_count", "gauge",
     "Instantaneous number of pending requests awaiting execution per-model."),
]


def _labels(**labels) -> str:
    """Labels in name order, a histogram bucket's `le` last (as Triton writes them)."""
    le = labels.pop("le", None)
    items = sorted(labels.items()) + ([("le", le)] if le is not None else [])
    inner = ",".join(f'{k}="{str(v).replace(chr(92), chr(92) * 2).replace(chr(34), chr(92) + chr(34))}"'
                     for k, v in items)
    return "{" + inner + "}" if inner else ""


def number(value: float) -> int | float:
    """A value as Triton writes it: a whole number without a decimal point (1, not 1.0)."""
    return int(value) if value == int(value) and abs(value) < 2**53 else value


class _Text:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def family(self, name: str, kind: str, help_text: str) -> None:
        self.lines.append(f"# HELP {name} {help_text}")
        self.lines.append(f"# TYPE {name} {kind}")

    def sample(self, name: str, value, **labels) -> None:
        self.lines.append(f"{name}{_labels(**labels)} {value}")

    def histogram(self, name: str, bounds, counts: list[int], total: float, **labels) -> None:
        running = 0
        for bound, n in zip(bounds, counts):
            running += n
            self.sample(f"{name}_bucket", running, le=str(number(float(bound))), **labels)
        running += counts[len(bounds)] if len(counts) > len(bounds) else 0
        self.sample(f"{name}_bucket", running, le="+Inf", **labels)
        self.sample(f"{name}_count", running, **labels)
        self.sample(f"{name}_sum", number(total), **labels)


class SystemSampler:
    """CPU utilization and memory (from /proc), and GPU figures through NVML where present,
    sampled on the metrics interval by a timer on the event loop."""

    def __init__(self, cpu: bool, gpu: bool, gpus: list[int]):
        self.cpu = cpu
        self.gpu = gpu
        self.gpus = gpus
        self.cpu_utilization = 0.0
        self.memory = (0, 0)
        self.gpu_values: dict[int, dict[str, float]] = {}
        self._last_cpu: tuple[int, int] | None = None
        self._nvml = None
        if gpu and gpus:
            try:
                import pynvml

                pynvml.nvmlInit()
                self._nvml = pynvml
            except Exception as e:  # no driver, no library: GPU metrics are simply absent
                log.info("GPU metrics are off: %s", e)

    def sample(self) -> None:
        if self.cpu:
            try:
                with open("/proc/stat") as f:
                    fields = [int(x) for x in f.readline().split()[1:]]
                idle, total = fields[3] + (fields[4] if len(fields) > 4 else 0), sum(fields)
                if self._last_cpu is not None and total > self._last_cpu[1]:
                    busy = 1 - (idle - self._last_cpu[0]) / (total - self._last_cpu[1])
                    self.cpu_utilization = max(0.0, min(1.0, busy))
                self._last_cpu = (idle, total)
                info = {}
                with open("/proc/meminfo") as f:
                    for line in f:
                        key, _, rest = line.partition(":")
                        info[key] = int(rest.split()[0]) * 1024
                self.memory = (info.get("MemTotal", 0), info.get("MemTotal", 0) - info.get("MemAvailable", 0))
            except (OSError, ValueError, IndexError):
                pass
        if self._nvml is not None:
            nv = self._nvml
            for index in self.gpus:
                try:
                    h = nv.nvmlDeviceGetHandleByIndex(index)
                    mem = nv.nvmlDeviceGetMemoryInfo(h)
                    self.gpu_values[index] = {
                        "uuid": nv.nvmlDeviceGetUUID(h),
                        "nv_gpu_utilization": nv.nvmlDeviceGetUtilizationRates(h).gpu / 100.0,
                        "nv_gpu_memory_total_bytes": mem.total, "nv_gpu_memory_used_bytes": mem.used,
                        "nv_gpu_power_usage": nv.nvmlDeviceGetPowerUsage(h) / 1000.0,
                        "nv_gpu_power_limit": nv.nvmlDeviceGetEnforcedPowerLimit(h) / 1000.0,
                        "nv_energy_consumption": nv.nvmlDeviceGetTotalEnergyConsumption(h) / 1000.0,
                    }
                except Exception as e:  # a GPU that stops answering loses its figures, not the server
                    log.debug("NVML query of GPU %d failed: %s", index, e)
                    self.gpu_values.pop(index, None)

    async def run(self, interval: float) -> None:
        while True:
            self.sample()
            await asyncio.sleep(interval)


_GPU_HELP = {
    "nv_gpu_utilization": ("gauge", "GPU utilization rate [0.0 - 1.0)"),
    "nv_gpu_memory_total_bytes": ("gauge", "GPU total memory, in bytes"),
    "nv_gpu_memory_used_bytes": ("gauge", "GPU used memory, in bytes"),
    "nv_gpu_power_usage": ("gauge", "GPU power usage in watts"),
    "nv_gpu_power_limit": ("gauge", "GPU power management limit in watts"),
    "nv_energy_consumption": ("counter", "GPU energy consumption in joules since the Triton Server started"),
}


_TICKS = os.sysconf("SC_CLK_TCK")
_PAGE = os.sysconf("SC_PAGE_SIZE")


def process_usage(pid: int) -> tuple[float, int] | None:
    """A process's CPU seconds (user + system) and resident bytes, from /proc; None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / _TICKS, int(fields[21]) * _PAGE
    except (OSError, IndexError, ValueError):
        return None


def render(models, system: SystemSampler) -> bytes:
    """The whole exposition text, read from the live model versions."""
    versions = [mv for e in models.models.values() for _, mv in sorted(e.versions.items())]
    out = _Text()
    for name, kind, help_text in _MODEL_METRICS:
        out.family(name, kind, help_text)
        for mv in versions:
            s = mv.stats
            labels = {"model": mv.name, "version": str(mv.version)}
            if name == "nv_inference_request_success":
                out.sample(name, s.counts["success"], **labels)
            elif name == "nv_inference_request_failure":
                for reason in FAILURE_REASONS:
                    out.sample(name, s.failures.get(reason, 0), reason=reason, **labels)
            elif name == "nv_inference_count":
                out.sample(name, s.inference_count, **labels)
            elif name == "nv_inference_exec_count":
                out.sample(name, s.execution_count, **labels)
            elif name == "nv_inference_request_duration_us":
                out.sample(name, (s.ns["success"] + s.ns["fail"]) // 1000, **labels)
            elif name == "nv_inference_pending_request_count":
                out.sample(name, mv.queued(), **labels)
            else:
                kind_name = name[len("nv_inference_"):-len("_duration_us")]
                out.sample(name, s.ns[kind_name] // 1000, **labels)
    if system.cpu:
        out.family("nv_cpu_utilization", "gauge", "CPU utilization rate [0.0 - 1.0]")
        out.sample("nv_cpu_utilization", system.cpu_utilization)
        out.family("nv_cpu_memory_total_bytes", "gauge", "CPU total memory (RAM), in bytes")
        out.sample("nv_cpu_memory_total_bytes", system.memory[0])
        out.family("nv_cpu_memory_used_bytes", "gauge", "CPU used memory (RAM), in bytes")
        out.sample("nv_cpu_memory_used_bytes", system.memory[1])
    if system.gpu_values:
        for metric, (kind, help_text) in _GPU_HELP.items():
            out.family(metric, kind, help_text)
            for _, values in sorted(system.gpu_values.items()):
                out.sample(metric, values[metric], gpu_uuid=values["uuid"])
    # what Triton users keep asking for
    out.family("tritonmp_batch_size", "histogram", "Batch sizes the model executed (rows per execution)")
    for mv in versions:
        s = mv.stats
        counts = [0] * (len(BATCH_BUCKETS) + 1)
        total = 0
        for size, entry in s.batches.items():
            slot = next((i for i, b in enumerate(BATCH_BUCKETS) if size <= b), len(BATCH_BUCKETS))
            counts[slot] += entry[0]
            total += size * entry[0]
        out.histogram("tritonmp_batch_size", BATCH_BUCKETS, counts, total, model=mv.name, version=str(mv.version))
    out.family("tritonmp_request_duration_us", "histogram",
               "Duration of requests from their arrival in the queue to their response, in microseconds")
    for mv in versions:
        s = mv.stats
        out.histogram("tritonmp_request_duration_us", LATENCY_BUCKETS_US, s.latency_buckets,
                      (s.ns["success"] + s.ns["fail"]) / 1000, model=mv.name, version=str(mv.version))
    out.family("tritonmp_queue_duration_us", "histogram",
               "Time requests waited in the model's queue before execution, in microseconds")
    for mv in versions:
        s = mv.stats
        out.histogram("tritonmp_queue_duration_us", LATENCY_BUCKETS_US, s.queue_buckets, s.ns["queue"] / 1000,
                      model=mv.name, version=str(mv.version))
    out.family("tritonmp_model_ready", "gauge",
               "1 when the model version is READY, 0 when it is loading, unloading or unavailable (a model "
               "that failed to load has version \"\"; models unloaded on purpose are not listed)")
    for name, entry in sorted(models.models.items()):
        for version, mv in sorted(entry.versions.items()):
            out.sample("tritonmp_model_ready", int(mv.state == "READY"), model=name, version=str(version))
        if entry.problem and not entry.versions:
            out.sample("tritonmp_model_ready", 0, model=name, version="")
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
    out.family("tritonmp_queue_depth", "gauge", "Requests waiting in the model's queue")
    out.family("tritonmp_inflight_requests", "gauge", "Requests executing on the model's instances")
    out.family("tritonmp_worker_restarts_total", "counter", "Worker processes of the model restarted after dying")
    out.family("tritonmp_model_load_duration_seconds", "gauge", "How long the model version took to load")
    for mv in versions:
        labels = {"model": mv.name, "version": str(mv.version)}
        out.sample("tritonmp_queue_depth", mv.queued(), **labels)
        out.sample("tritonmp_inflight_requests", mv.in_flight(), **labels)
        out.sample("tritonmp_worker_restarts_total", mv.restarts(), **labels)
        out.sample("tritonmp_model_load_duration_seconds", round(mv.load_seconds, 6), **labels)
    out.family("tritonmp_worker_cpu_seconds_total", "counter", "CPU time used by the worker process of an instance")
    out.family("tritonmp_worker_resident_memory_bytes", "gauge", "Resident memory of the worker process of an instance")
    for mv in versions:
        for instance in mv.instances():
            usage = process_usage(instance.pid) if instance.pid is not None else None
            if usage is not None:
                labels = {"model": mv.name, "version": str(mv.version), "instance": instance.name}
                out.sample("tritonmp_worker_cpu_seconds_total", round(usage[0], 3), **labels)
                out.sample("tritonmp_worker_resident_memory_bytes", usage[1], **labels)
    usage = process_usage(os.getpid())  # the frontend, under the names every Prometheus client uses
    if usage is not None:
        out.family("process_cpu_seconds_total", "counter", "Total user and system CPU time spent in seconds")
        out.sample("process_cpu_seconds_total", round(usage[0], 3))
        out.family("process_resident_memory_bytes", "gauge", "Resident memory size in bytes")
        out.sample("process_resident_memory_bytes", usage[1])
    models.services.custom_metrics.render(out)  # python models' own (pb_utils.MetricFamily)
    return ("\n".join(out.lines) + "\n").encode()


class MetricsApp:
    """ASGI app for the metrics port: GET /metrics (Triton's), and tritonmp's live status page (GET /)
    with the JSON it reads (GET /status.json); 404 elsewhere, as Triton."""

    def __init__(self, api, system: SystemSampler, history: StatusHistory):
        self.api = api  # the server API: its models, settings and shared memory
        self.system = system
        self.history = history

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return
        path, method = scope["path"], scope["method"]
        headers = []
        if method not in ("GET", "HEAD") or path not in ("/metrics", "/", "/status.json"):
            status, body, ctype = 404, b"", b"text/plain"
        elif path == "/metrics":
            status, body, ctype = 200, render(self.api.models, self.system), CONTENT_TYPE_LATEST.encode()
        elif path == "/status.json":
            status, ctype = 200, b"application/json"
            body = orjson.dumps(status_document(self.api, self.system, self.history))
            headers.append((b"cache-control", b"no-store"))
        else:
            status, body, ctype = 200, status_page(), b"text/html; charset=utf-8"
            headers.append((b"content-security-policy",
                            b"default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
                            b"connect-src 'self'; img-src 'self' data:"))
        headers += [(b"content-type", ctype), (b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": b"" if method == "HEAD" else body})


@functools.cache
def status_page() -> bytes:
    """The status page: one self-contained file shipped in the package (no CDN, works air-gapped)."""
    return (Path(__file__).parent / "status_page.html").read_bytes()
