"""What the frontends, the server API, metrics, the status page and statistics may ask of a served
model version, as one typed contract.

A model's version (lifecycle.model_version.ModelVersion: instance pools of worker processes) and
an ensemble's (lifecycle.ensemble_version.EnsembleVersion: steps run in the frontend) both
implement it in full; the model manager serves every version as a ServedVersion, so the type
checker (`make test` runs mypy) refuses a version kind that lacks a member any reader uses, and no
reader sees what stands behind a version (its pool, its instances, their processes)."""

from __future__ import annotations

import asyncio
from collections.abc import Sized
from typing import Any, Protocol

from tritonclient.grpc import model_config_pb2 as mc

from .inference import InferRequest, InferResponse
from .instances.contract import InstanceSnapshot
from .observability.stats import ModelStats
from .validation import TensorConfig

__all__ = ["InstanceSnapshot", "ServedScheduler", "ServedVersion"]


class ServedScheduler(Protocol):
    """Where a version's requests go."""

    @property
    def queue(self) -> Sized:
        """The requests waiting for an instance."""
        ...

    def submit(self, request: InferRequest) -> asyncio.Future[InferResponse]: ...

    def busy(self) -> bool: ...

    def keeps_state(self) -> bool:
        """Whether it holds something between requests that unloading the model would lose (open
        sequences)."""
        ...

    async def drained(self) -> None: ...

    def fail_all(self, error: Exception) -> None: ...


class ServedVersion(Protocol):
    """One served version of a model or an ensemble."""

    @property
    def name(self) -> str: ...

    @property
    def namespace(self) -> str:
        """The repository it is from, with --model-namespacing; "" without."""
        ...

    @property
    def version(self) -> int: ...

    @property
    def backend(self) -> str: ...

    @property
    def config(self) -> mc.ModelConfig: ...

    @property
    def config_json(self) -> dict[str, Any]: ...

    @property
    def state(self) -> str:
        """LOADING, READY, UNLOADING or UNAVAILABLE, as Triton names them."""
        ...

    # why it is not READY; the model manager also says so when a later load failed beside it
    reason: str

    @property
    def load_seconds(self) -> float: ...

    @property
    def max_batch_size(self) -> int: ...

    @property
    def inputs(self) -> dict[str, TensorConfig]: ...

    @property
    def outputs(self) -> dict[str, str]:
        """Output name -> its datatype."""
        ...

    @property
    def labels(self) -> dict[str, list[str]]:
        """Output name -> its classification labels."""
        ...

    @property
    def decoupled(self) -> bool:
        """Whether it may send any number of responses per request."""
        ...

    @property
    def merge(self) -> bool:
        """Whether a batch's requests are merged into one set of tensors (every backend whose model
        takes a batch whole)."""
        ...

    @property
    def stats(self) -> ModelStats:
        """Its statistics, as Triton's statistics extension and metrics count them."""
        ...

    def queued(self) -> int:
        """Requests waiting to run: in its scheduler's queue, or sent ahead to a busy instance."""
        ...

    def in_flight(self) -> int:
        """Requests in the batches its instances run now."""
        ...

    def restarts(self) -> int:
        """Restarts of its instances' workers tried since it was loaded."""
        ...

    def instances(self) -> list[InstanceSnapshot]:
        """Its instances as they are now (none for an ensemble)."""
        ...

    async def readiness(self) -> str:
        """Why the version, loaded, cannot serve now (a worker restarting, the model's own readiness
        check saying no), or "" when it can."""
        ...

    @property
    def scheduler(self) -> ServedScheduler: ...

    async def load(self) -> None: ...

    async def retire(self, timeout: float) -> None:
        """Finish what is queued and in flight, then stop."""
        ...

    async def stop(self, deadline: float) -> None: ...
