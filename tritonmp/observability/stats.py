"""Per model version statistics in Triton's terms: request counts and durations, executions, and
the same per batch size; rendered in Triton's JSON shape (the gRPC reply is parsed from it)."""

from __future__ import annotations

import time
from bisect import bisect_left

from .latency_metrics import LatencyRecorder

# upper bounds (microseconds) of the request and queue duration histograms' buckets: a duration counts in
# the first whose bound it does not exceed (bisect_left), else in +Inf, the last
LATENCY_BUCKETS_US = (100, 250, 500, 1000, 2500, 5000, 10000, 25000, 50000, 100000, 250000, 500000, 1000000,
                      2500000, 5000000)


class ModelStats:
    """Counters of one model version. Durations are nanoseconds, as Triton reports them."""

    KINDS = ("success", "fail", "queue", "compute_input", "compute_infer", "compute_output", "cache_hit",
             "cache_miss")

    def __init__(self, name: str, version: int, latency: LatencyRecorder | None = None, decoupled: bool = False):
        self.name = name
        self.version = version
        # --metrics-config summaries and the first-response histogram, where asked for
        self.latency = latency
        self.decoupled = decoupled  # its first responses are told apart (first_response), not its ends
        self.last_inference_ms = 0
        self.inference_count = 0  # rows (batch size) of successful requests
        self.execution_count = 0
        self.counts = dict.fromkeys(self.KINDS, 0)
        self.ns = dict.fromkeys(self.KINDS, 0)
        self.batches: dict[int, list[int]] = {}  # batch size -> [count, input ns, infer ns, output ns]
        self.failures: dict[str, int] = {}  # failure reason -> count
        self.latency_buckets = [0] * (len(LATENCY_BUCKETS_US) + 1)  # request duration histogram, +Inf last
        self.queue_buckets = [0] * (len(LATENCY_BUCKETS_US) + 1)  # queue time histogram, +Inf last

    def _add(self, kind: str, ns: int, count: int = 1) -> None:
        self.counts[kind] += count
        self.ns[kind] += ns * count

    def executed(self, batch_size: int, requests: int, input_ns: int, infer_ns: int, output_ns: int) -> None:
        """One execution of a batch of `batch_size` rows, of which `requests` requests succeeded. As
        in Triton, every execution counts (one that failed too), and a request's compute times count
        in its inference statistics only when it succeeded."""
        self.execution_count += 1
        self.last_inference_ms = int(time.time() * 1000)
        self._add("compute_input", input_ns, requests)
        self._add("compute_infer", infer_ns, requests)
        self._add("compute_output", output_ns, requests)
        if self.latency is not None and requests:
            self.latency.observe("compute_input", input_ns, requests)
            self.latency.observe("compute_infer", infer_ns, requests)
            self.latency.observe("compute_output", output_ns, requests)
        entry = self.batches.setdefault(batch_size, [0, 0, 0, 0])
        entry[0] += 1
        entry[1] += input_ns
        entry[2] += infer_ns
        entry[3] += output_ns

    def cache_hit(self, lookup_ns: int, batch_size: int) -> None:
        """A response served from the cache: a success, but no inference (as Triton counts it)."""
        self._add("cache_hit", lookup_ns)
        self._add("success", lookup_ns)
        self.last_inference_ms = int(time.time() * 1000)
        if self.latency is not None:
            self.latency.observe("cache_hit", lookup_ns)
            self.latency.first_response(lookup_ns)

    def cache_miss(self, insert_ns: int) -> None:
        self._add("cache_miss", insert_ns)
        if self.latency is not None:
            self.latency.observe("cache_miss", insert_ns)

    def first_response(self, ns: int) -> None:
        """A decoupled model's first response to a request, `ns` after the request arrived."""
        if self.latency is not None:
            self.latency.first_response(ns)

    def finished(self, ok: bool, batch_size: int, duration_ns: int, reason: str = "BACKEND", queue_ns: int = 0) -> None:
        """A request that reached the queue is done; `reason` says why it failed (Triton's labels:
        REJECTED, CANCELED, BACKEND, OTHER). Its time in the queue counts when it succeeded, as in
        Triton."""
        if ok:  # _add and the buckets written out: this runs for every request
            self.counts["success"] += 1
            self.ns["success"] += duration_ns
            self.inference_count += batch_size
            self.counts["queue"] += 1
            self.ns["queue"] += queue_ns
            self.queue_buckets[bisect_left(LATENCY_BUCKETS_US, queue_ns / 1000)] += 1
            if self.latency is not None:
                self.latency.observe("request", duration_ns)
                self.latency.observe("queue", queue_ns)
                if not self.decoupled:
                    self.latency.first_response(duration_ns)
        else:
            self._add("fail", duration_ns)
            self.failures[reason] = self.failures.get(reason, 0) + 1
        self.latency_buckets[bisect_left(LATENCY_BUCKETS_US, duration_ns / 1000)] += 1

    def to_json(self) -> dict:
        def d(count, ns):
            return {"count": count, "ns": ns}

        inference = {k: d(self.counts[k], self.ns[k]) for k in self.KINDS}
        batches = [{"batch_size": size, "compute_input": d(e[0], e[1]), "compute_infer": d(e[0], e[2]),
                    "compute_output": d(e[0], e[3])} for size, e in sorted(self.batches.items())]
        return {"name": self.name, "version": str(self.version), "last_inference": self.last_inference_ms,
                "inference_count": self.inference_count, "execution_count": self.execution_count,
                "inference_stats": inference, "response_stats": {}, "batch_stats": batches, "memory_usage": []}
