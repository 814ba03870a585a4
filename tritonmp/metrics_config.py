"""--metrics-config as Triton reads it: which latency metrics are exported (the duration counters,
the summaries and their quantiles, the first-response histogram), read from SETTING=VALUE pairs."""

from __future__ import annotations

import re
from dataclasses import dataclass

DEFAULT_QUANTILES = ((0.5, 0.05), (0.9, 0.01), (0.95, 0.001), (0.99, 0.001), (0.999, 0.0001))


class MetricsConfigError(ValueError):
    """A --metrics-config setting this server does not know, or a value it cannot read."""


@dataclass(frozen=True)
class MetricsConfig:
    counter_latencies: bool = True  # the nv_inference_*_duration_us counters
    summary_latencies: bool = False  # the nv_inference_*_summary_us summaries
    summary_quantiles: tuple[tuple[float, float], ...] = DEFAULT_QUANTILES  # (quantile, allowed error)
    summary_max_age: float = 60.0  # seconds of values a summary's quantiles are read from
    histogram_latencies: bool = False  # nv_inference_first_response_histogram_ms

    @property
    def recording(self) -> bool:
        """Whether a model version records values one by one (for summaries or histograms)."""
        return self.summary_latencies or self.histogram_latencies


def _bool(key: str, value: str) -> bool:
    if value.lower() in ("true", "1", "on", "yes"):
        return True
    if value.lower() in ("false", "0", "off", "no"):
        return False
    raise MetricsConfigError(f"--metrics-config {key} must be true or false, got '{value}'")


_NUMBER = re.compile(r"\s*[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")


def _leading_number(text: str) -> float | None:
    """The number `text` starts with, as C's strtod reads it (Triton reads "0.0.1" as 0.0)."""
    match = _NUMBER.match(text)
    return float(match.group(0)) if match else None


def _quantiles(value: str) -> tuple[tuple[float, float], ...]:
    out = []
    for pair in value.split(","):
        quantile, _, error = pair.partition(":")
        q, e = _leading_number(quantile), _leading_number(error)
        if q is None or e is None:
            raise MetricsConfigError("--metrics-config summary_quantiles must be <quantile>:<error>,..., "
                                     f"got '{value}'")
        if not (0 <= q <= 1 and 0 <= e <= 1):
            raise MetricsConfigError(f"--metrics-config summary_quantiles: quantiles and errors are between 0 and 1, "
                                     f"got '{pair}'")
        out.append((q, e))
    return tuple(out)


def parse_metrics_config(settings: dict[str, str]) -> MetricsConfig:
    """The settings of --metrics-config (Triton's counter_latencies, summary_latencies,
    summary_quantiles, histogram_latencies; and summary_max_age in seconds); MetricsConfigError for
    one this server does not know, naming those it does."""
    known = {"counter_latencies", "summary_latencies", "summary_quantiles", "summary_max_age", "histogram_latencies"}
    for key in settings:
        if key not in known:
            raise MetricsConfigError(f"unknown --metrics-config setting '{key}'; known: {', '.join(sorted(known))}")
    max_age = settings.get("summary_max_age", "60")
    try:
        age = float(max_age)
    except ValueError:
        age = -1.0
    if not age > 0:
        raise MetricsConfigError(f"--metrics-config summary_max_age must be a number of seconds above 0, "
                                 f"got '{max_age}'")
    return MetricsConfig(
        counter_latencies=_bool("counter_latencies", settings.get("counter_latencies", "true")),
        summary_latencies=_bool("summary_latencies", settings.get("summary_latencies", "false")),
        summary_quantiles=_quantiles(settings["summary_quantiles"]) if "summary_quantiles" in settings
        else DEFAULT_QUANTILES,
        summary_max_age=age,
        histogram_latencies=_bool("histogram_latencies", settings.get("histogram_latencies", "false")))
