"""The one hook the test suite has into the server's behaviour: environment variables that a test
sets for the server it starts, read here and nowhere else. Nothing a deployment sets.

- TRITONMP_FAKE_GPUS="0,1": the server believes these GPUs exist (placement and KIND_GPU checks on
  a machine without one); the tests that need a real GPU skip while it is set.
- TRITONMP_WORKER_IDLE_TRIM_S=1: a worker gives the memory it keeps for reuse back to the system
  after this many idle seconds (10 otherwise), so a test need not wait for it.
- TRITONSERVER_DELAY_SCHEDULER=N and TRITONSERVER_BACKLOG_DELAY_SCHEDULER=M, Triton's own hooks for
  its qa tests of the sequence batcher (qa/L0_sequence_batcher) and the dynamic batcher
  (qa/L0_rate_limiter), which they set for the server they start: the sequence batcher forms no
  batch until N requests wait in its slots (and M in its backlog), the dynamic batcher until N wait
  in its queue, so that a test knows which requests run together; from then on they batch as usual.
- TRITONMP_TEMPLATE_FAILS="python,...": the worker templates of these backends exit before they
  are ready (as one whose framework crashed it at import), so that a test sees their workers
  started by exec instead.
- TRITONMP_CHECK_FAST_PATHS=1 (the test suite sets it for every server it starts): whatever a fast
  path takes (the typed HTTP decode, the one-pass gRPC decode, the one-pass request check) is
  taken by the one place that states the rules as well, and any difference is an internal error
  naming both answers. A rule added to the general path that its fast path misses then fails the
  first test that sends a request the rule is about. Read once, at import: nothing is checked, and
  nothing costs, where it is not set.
"""

from __future__ import annotations

import os

from .inference import InferRequest

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


def template_fails(backend: str) -> bool:
    """Whether the worker template of `backend` is to fail before it is ready."""
    return backend in os.environ.get("TRITONMP_TEMPLATE_FAILS", "").split(",")


CHECK_FAST_PATHS = os.environ.get("TRITONMP_CHECK_FAST_PATHS") == "1"


def scheduler_delays() -> tuple[int, int]:
    """The requests the batchers wait for before their first batch: (in the sequence batcher's slots,
    or the dynamic batcher's queue; in the sequence batcher's backlog); (0, 0) but in Triton's qa tests."""
    def count(name: str) -> int:
        text = os.environ.get(name, "")
        return int(text) if text.isdigit() else 0

    return count("TRITONSERVER_DELAY_SCHEDULER"), count("TRITONSERVER_BACKLOG_DELAY_SCHEDULER")


def _plain(value):
    """A tensor's data or a parameter, comparable whatever holds its bytes."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    tobytes = getattr(value, "tobytes", None)  # an array's
    return tobytes() if tobytes is not None else value


def request_difference(fast: InferRequest, rules: InferRequest) -> str:
    """How two decodes of one request differ ("" when they agree): the fields a frontend fills."""
    def fields(r: InferRequest):
        return (r.model_name, r.model_version, r.id, r.parameters, r.empty_final,
                [(t.name, t.datatype, list(t.shape), _plain(t.data), t.parameters) for t in r.inputs],
                None if r.outputs is None else [(o.name, o.parameters) for o in r.outputs])

    a, b = fields(fast), fields(rules)
    return "" if a == b else f"fast path {a!r:.2000}, rules {b!r:.2000}"
