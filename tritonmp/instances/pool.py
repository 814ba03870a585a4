"""The instances of one model version (instance.Instance, each a worker process) and the queue of
those ready for work, which the version's scheduler feeds; their settings, given at construction."""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from ..errors import ServerError, Status
from ..inference import InferRequest
from ..ipc.busy_poll import BusyPoll
from ..observability.stats import ModelStats
from ..repository.ragged import Ragged
from ..repository.reshape import Reshapes
from .instance import Instance
from .model_calls import ModelServices
from .worker_process import InstanceSpec, LoadError, WorkerProcess

__all__ = ["NO_BUSY_POLL", "Instance", "InstancePool", "InstanceSpec", "LoadError", "ModelServices", "PoolSettings"]


NO_BUSY_POLL = BusyPoll(0)


@dataclass
class PoolSettings:
    """How a model version's instances run, from the server's settings and the model's config."""

    arena_bytes: int = 64 << 20
    log_verbose: int = 0
    gpus: list[int] | None = None  # the server's GPUs, for KIND_MODEL instances
    execution_timeout: float = 0.0  # seconds a batch may run before its worker is killed; 0: no limit
    load_timeout: float = 0.0  # seconds a worker may take to load before it is killed; 0: no limit
    heap_retain_bytes: int = 0  # memory a worker frees that it keeps for reuse (--worker-heap-retain-mb)
    busy_poll: BusyPoll = NO_BUSY_POLL  # the server's polling window (--busy-poll-us)
    decoupled: bool = False  # responses stream back, any number per request
    warmup: list = field(default_factory=list)  # (sample name, count, request template), run before READY
    reshapes: Reshapes | None = None  # the config's reshapes of inputs and outputs, applied at the wire
    ragged: Ragged | None = None  # ragged inputs, batch inputs and batch outputs, of merged batches


class InstancePool:
    """The instances of one model version and the queue of those ready for work."""

    def __init__(self, model_name: str, version: int, model_dir: str, backend: str, config_json: str,
                 specs: list[InstanceSpec], output_types: dict[str, str], settings: PoolSettings,
                 services: ModelServices, on_unavailable: Callable[[str], None] = lambda why: None):
        self.model_name = model_name
        self.version = version
        self.model_dir = model_dir
        self.backend = backend
        self.config_json = config_json
        self.output_types = output_types
        self.arena_bytes = settings.arena_bytes
        self.log_verbose = settings.log_verbose
        self.gpus = settings.gpus
        self.execution_timeout = settings.execution_timeout
        self.busy_poll = settings.busy_poll
        self.decoupled = settings.decoupled
        self.load_timeout = settings.load_timeout
        self.heap_retain_bytes = settings.heap_retain_bytes
        self.warmup = settings.warmup
        self.reshapes = settings.reshapes
        self.merge = backend != "python"  # a batch's requests are merged into one set of tensors
        self.ragged = settings.ragged if self.merge else None  # a python model takes its requests one by one
        self.senders = backend == "python"  # a request may be answered through its response sender
        self.null_rows = False  # batches may hold placeholder rows (InferRequest.null): the sequence batcher's
        self.services = services
        self.on_unavailable = on_unavailable  # the model version must go down, and why
        # the scheduler's (attach): an instance can take work, none can, a request to run again
        self.on_idle: Callable[[], None] = lambda: None
        self.on_down: Callable[[ServerError], None] = lambda error: None
        self.reschedule: Callable[[InferRequest], None] = lambda request: None
        self.instances = [Instance(self, s) for s in specs]
        self.idle: deque[Instance] = deque()
        self.restart_count = 0
        self.stats = ModelStats(model_name, version)

    def attach(self, pump: Callable[[], None], fail_all: Callable[[ServerError], None],
               reschedule: Callable[[InferRequest], None] | None = None) -> None:
        """The scheduler that feeds this pool: `pump` when an instance can take work, `fail_all` when
        none can, `reschedule` for a request its model asked to run again (iterative sequences)."""
        self.on_idle, self.on_down = pump, fail_all
        if reschedule is not None:
            self.reschedule = reschedule

    async def start(self) -> None:
        results = await asyncio.gather(*(i.start() for i in self.instances), return_exceptions=True)
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors:
            await self.stop(time.monotonic() + 5)
            first = errors[0]
            raise LoadError(str(first)) if not isinstance(first, LoadError) else first
        for instance in self.instances:
            self.idle.append(instance)

    def put_idle(self, instance: Instance) -> None:
        if instance.alive and instance not in self.idle:
            self.idle.append(instance)
        self.on_idle()

    def forget_idle(self, instance: Instance) -> None:
        try:
            self.idle.remove(instance)
        except ValueError:
            pass

    def crash_looped(self, instance: WorkerProcess, why: str) -> None:
        """An instance gave up; once all have, the model version goes UNAVAILABLE."""
        instance.gave_up = True
        if all(i.gave_up for i in self.instances):
            self.on_unavailable(why)
            self.on_down(ServerError(f"model '{self.model_name}' version {self.version} is unavailable: {why}",
                                     Status.UNAVAILABLE))

    def sent_ahead(self) -> int:
        """Requests sent to an instance to run after its batch in flight: still waiting, as those
        in the scheduler's queue are."""
        return sum(len(i.ahead.batch) for i in self.instances if i.ahead is not None)

    def any_alive(self) -> bool:
        return any(i.alive for i in self.instances)

    async def readiness(self) -> str:
        """Why the version is not ready to serve, or "" when it is: each instance must be (Triton's
        rule), and the first reason found, in the instances' order, is the answer."""
        if len(self.instances) == 1:
            return await self.instances[0].readiness()
        reasons = await asyncio.gather(*(i.readiness() for i in self.instances))
        return next((r for r in reasons if r), "")

    async def stop(self, deadline: float) -> None:
        await asyncio.gather(*(i.stop(deadline) for i in self.instances), return_exceptions=True)
        self.idle.clear()
        self.services.custom_metrics.drop_owner(self)  # the model's own metrics go with it
