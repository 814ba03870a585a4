"""Prometheus' text exposition format as Triton writes it: families with their help and type,
samples with their labels in name order (a histogram bucket's `le` and a summary's `quantile` last),
whole numbers without a decimal point. Triton exposes its counters without a `_total` suffix, so the
text is written here rather than through prometheus_client's Counter."""

from __future__ import annotations

LAST = ("le", "quantile")  # a histogram bucket's bound, a summary's quantile


def _labels(**labels) -> str:
    """Labels in name order, a histogram bucket's `le` or a summary's `quantile` last (as Triton writes them)."""
    last = [(k, labels.pop(k)) for k in LAST if k in labels]
    items = sorted(labels.items()) + last
    inner = ",".join(f'{k}="{str(v).replace(chr(92), chr(92) * 2).replace(chr(34), chr(92) + chr(34))}"'
                     for k, v in items)
    return "{" + inner + "}" if inner else ""


def number(value: float) -> int | float:
    """A value as Triton writes it: a whole number without a decimal point (1, not 1.0)."""
    return int(value) if value == int(value) and abs(value) < 2**53 else value


class Exposition:
    """The lines of one exposition, written in order."""

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
