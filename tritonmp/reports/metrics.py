"""What the Prometheus endpoint says: Triton's nv_* metrics (per model version, CPU, and GPU through
NVML), plus tritonmp_* metrics Triton lacks (batch-size and request-duration histograms, queue
depth, in-flight requests, worker restarts, model load time, residency), and the metric families
python models define.

Everything is read at scrape time from the frontend's own counters (each served version's
ModelStats and figures), which workers' timings already reach through the result messages: no
second set of books and no multiprocess registry.
"""

from __future__ import annotations

import os

from ..observability.exposition import Exposition
from ..observability.stats import LATENCY_BUCKETS_US
from ..observability.system import SystemSampler, process_usage

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


_GPU_HELP = {
    "nv_gpu_utilization": ("gauge", "GPU utilization rate [0.0 - 1.0)"),
    "nv_gpu_memory_total_bytes": ("gauge", "GPU total memory, in bytes"),
    "nv_gpu_memory_used_bytes": ("gauge", "GPU used memory, in bytes"),
    "nv_gpu_power_usage": ("gauge", "GPU power usage in watts"),
    "nv_gpu_power_limit": ("gauge", "GPU power management limit in watts"),
    "nv_energy_consumption": ("counter", "GPU energy consumption in joules since the Triton Server started"),
}


def render(models, system: SystemSampler) -> bytes:
    """The whole exposition text, read from the live model versions."""
    versions = [mv for e in models.models.values() for _, mv in sorted(e.versions.items())]
    out = Exposition()
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


