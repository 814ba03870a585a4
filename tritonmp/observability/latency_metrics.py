"""The latency metrics --metrics-config turns on (metrics_config.py), as Triton's: the sliding-window summaries
(`nv_inference_*_summary_us`, `nv_cache_*_summary_per_model`) and the time-to-first-response
histogram (`nv_inference_first_response_histogram_ms`) of one model version (`LatencyRecorder`).

A summary keeps the values observed in its last `summary_max_age` seconds (at most WINDOW_LIMIT of
them) and reads their quantiles at scrape time; its count and sum are of every value observed."""

from __future__ import annotations

import math
import time
from collections import deque

from tritonclient.grpc import model_config_pb2 as mc

from ..metrics_config import MetricsConfig

FIRST_RESPONSE = "nv_inference_first_response_histogram_ms"
DEFAULT_FIRST_RESPONSE_BUCKETS_MS = (100.0, 500.0, 2000.0, 5000.0)
WINDOW_LIMIT = 100_000  # values a summary keeps for its quantiles; the oldest go first
SUMMARIES = ("request", "queue", "compute_input", "compute_infer", "compute_output", "cache_hit", "cache_miss")


def first_response_buckets(config: mc.ModelConfig) -> tuple[float, ...]:
    """The time-to-first-response histogram's bucket bounds: the config's model_metrics override for
    the family, else Triton's defaults."""
    for control in config.model_metrics.metric_control:
        if control.metric_identifier.family == FIRST_RESPONSE and control.histogram_options.buckets:
            return tuple(sorted(control.histogram_options.buckets))
    return DEFAULT_FIRST_RESPONSE_BUCKETS_MS


class Summary:
    """Values in microseconds: all of them counted and summed, the recent ones kept for quantiles."""

    __slots__ = ("count", "total", "window", "max_age")

    def __init__(self, max_age: float):
        self.count = 0
        self.total = 0
        self.window: deque[tuple[float, int]] = deque(maxlen=WINDOW_LIMIT)
        self.max_age = max_age

    def observe(self, value_us: int, now: float) -> None:
        self.count += 1
        self.total += value_us
        self.window.append((now, value_us))

    def quantiles(self, wanted: tuple[tuple[float, float], ...], now: float) -> list[float]:
        """Each quantile of the values of the last max_age seconds (NaN where there are none)."""
        window = self.window
        while window and window[0][0] < now - self.max_age:
            window.popleft()
        values = sorted(v for _, v in window)
        if not values:
            return [math.nan] * len(wanted)
        return [values[max(0, math.ceil(q * len(values)) - 1)] for q, _ in wanted]


class LatencyRecorder:
    """One model version's summaries and first-response histogram, as its MetricsConfig asks."""

    def __init__(self, config: MetricsConfig, buckets_ms: tuple[float, ...] = DEFAULT_FIRST_RESPONSE_BUCKETS_MS,
                 request_summary: bool = True):
        self.config = config
        self.summaries = {k: Summary(config.summary_max_age) for k in SUMMARIES} if config.summary_latencies else {}
        if not request_summary:  # Triton's is not kept for a model whose responses may come from the cache
            self.summaries.pop("request", None)
        self.buckets_ms = buckets_ms
        self.first_counts = [0] * (len(buckets_ms) + 1) if config.histogram_latencies else []
        self.first_sum_ms = 0  # whole milliseconds, as Triton observes them

    def observe(self, kind: str, ns: int, times: int = 1) -> None:
        summary = self.summaries.get(kind)
        if summary is not None:
            now = time.monotonic()
            for _ in range(times):
                summary.observe(ns // 1000, now)

    def first_response(self, ns: int) -> None:
        if self.first_counts:
            ms = ns // 1_000_000
            self.first_sum_ms += ms
            slot = next((i for i, bound in enumerate(self.buckets_ms) if ms <= bound), len(self.buckets_ms))
            self.first_counts[slot] += 1
