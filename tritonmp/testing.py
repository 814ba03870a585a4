"""The one hook the test suite has into the server's behaviour: environment variables that a test
sets for the server it starts, read here and nowhere else. Nothing a deployment sets.

- TRITONMP_FAKE_GPUS="0,1": the server believes these GPUs exist (placement and KIND_GPU checks on
  a machine without one); the tests that need a real GPU skip while it is set.
- TRITONMP_WORKER_IDLE_TRIM_S=1: a worker gives the memory it keeps for reuse back to the system
  after this many idle seconds (10 otherwise), so a test need not wait for it.
"""

from __future__ import annotations

import os

FAKE_GPUS_ENV = "TRITONMP_FAKE_GPUS"
IDLE_TRIM_ENV = "TRITONMP_WORKER_IDLE_TRIM_S"


def fake_gpus() -> list[int] | None:
    """The GPUs a test pretends exist, or None (the real ones count)."""
    fake = os.environ.get(FAKE_GPUS_ENV)
    if fake is None:
        return None
    return [int(p) for p in fake.split(",") if p.strip().isdigit()]


def worker_idle_trim_s(default: float) -> float:
    """Seconds a worker waits idle before it trims its heap."""
    return float(os.environ.get(IDLE_TRIM_ENV, default))
