"""One served version of a model: its instance pool of worker processes and the scheduler that
feeds it, built from its configuration and the server's settings (ServerSettings); loaded, retired
(finishing its requests), stopped."""

from __future__ import annotations

import asyncio
import json
import time

from tritonclient.grpc import model_config_pb2 as mc

from .. import backends, gpus, host_policy
from ..classification import read_labels
from ..errors import unavailable
from ..instances.contract import NO_BUSY_POLL
from ..instances.pool import (
    InstancePool,
    InstanceSettings,
    InstanceSnapshot,
    InstanceSpec,
    LaunchSpec,
    LoadError,
    ModelServices,
)
from ..instances.rate_limiter import RateLimiter, demand_of
from ..instances.templates import WorkerTemplates
from ..ipc.busy_poll import BusyPoll
from ..logs import get_logger
from ..observability.latency_metrics import LatencyRecorder, first_response_buckets
from ..observability.stats import ModelStats
from ..repository import config as cfg
from ..repository.ragged import Ragged
from ..repository.reshape import Reshapes
from ..repository.warmup import warmup_requests
from ..scheduling.scheduler import BatchPolicy, Priorities, QueuePolicy, Scheduler
from ..scheduling.sequence import SequenceScheduler, placeholder_rows
from ..settings import ServerSettings
from ..validation import TensorConfig

log = get_logger("models")


class ModelVersion:
    def __init__(self, name: str, version: int, completed: cfg.Completed, specs: list[InstanceSpec],
                 settings: ServerSettings, services: ModelServices, poll: BusyPoll = NO_BUSY_POLL,
                 templates: WorkerTemplates | None = None, namespace: str = "",
                 limiter: RateLimiter | None = None):
        self.name = name
        self.namespace = namespace  # its repository, with --model-namespacing
        self.version = version
        self.config = completed.config
        self.backend = completed.backend
        self.state = "LOADING"
        self.reason = ""
        self.load_seconds = 0.0
        c = completed.config
        self.max_batch_size = c.max_batch_size
        self.inputs = {t.name: TensorConfig(t.name, cfg.tensor_datatype(t), tuple(t.dims), t.optional,
                                            t.allow_ragged_batch)
                       for t in c.input}
        self.outputs = {t.name: cfg.tensor_datatype(t) for t in c.output}
        self.config_json = cfg.to_json(c)
        self.labels = read_labels(completed.model_dir, c)
        launch = LaunchSpec(
            name, version, completed.model_dir, completed.backend, json.dumps(self.config_json),
            arena_bytes=settings.arena_bytes, log_verbose=settings.log_verbose,
            gpus=tuple(settings.gpus), load_timeout=settings.load_timeout,
            heap_retain_bytes=settings.heap_retain_bytes, templates=templates, code_file=completed.code_file,
            python_env=completed.python_env)
        one_by_one = backends.one_by_one(completed.backend)
        instance_settings = InstanceSettings(
            name, version, self.outputs, merge=not one_by_one, senders=one_by_one,
            decoupled=c.model_transaction_policy.decoupled, null_rows=placeholder_rows(c),
            execution_timeout=_execution_timeout(c, settings.execution_timeout), busy_poll=poll,
            warmup=tuple(warmup_requests(c, completed.model_dir)), reshapes=Reshapes.of(c),
            ragged=None if one_by_one else Ragged.of(c), namespace=namespace, latency=latency_recorder(settings, c))
        self.pool = InstancePool(launch, instance_settings, specs, services, self._crash_looped, limiter)
        db = c.dynamic_batching if c.HasField("dynamic_batching") else None
        policy = BatchPolicy(c.max_batch_size, db is not None,
                             list(db.preferred_batch_size) if db else [],
                             (db.max_queue_delay_microseconds if db else 0) * 1000)
        self.scheduler: Scheduler | SequenceScheduler
        if c.HasField("sequence_batching") and c.sequence_batching.iterative_sequence:
            # each request is a sequence of its own, run again for as long as the model reschedules it;
            # requests run together up to max_batch_size, as their iterations come round
            self.scheduler = Scheduler(self.pool, BatchPolicy(c.max_batch_size, c.max_batch_size > 0, [], 0))
        elif c.HasField("sequence_batching"):
            self.scheduler = SequenceScheduler(self.pool, c)
        else:
            self.scheduler = Scheduler(self.pool, policy, priorities=priorities_of(c),
                                       preserve_ordering=bool(db and db.preserve_ordering))

    # -- what readers may ask (served.ServedVersion) ---------------------------------------
    @property
    def decoupled(self) -> bool:
        return self.pool.settings.decoupled

    @property
    def merge(self) -> bool:
        return self.pool.settings.merge

    @property
    def stats(self) -> ModelStats:
        return self.pool.stats

    def queued(self) -> int:
        return len(self.scheduler.queue) + self.pool.sent_ahead()

    def in_flight(self) -> int:
        return self.pool.in_flight()

    def restarts(self) -> int:
        return self.pool.restarts()

    def instances(self) -> list[InstanceSnapshot]:
        return self.pool.snapshots()

    async def readiness(self) -> str:
        return await self.pool.readiness()

    def _crash_looped(self, why: str) -> None:
        self.state, self.reason = "UNAVAILABLE", why

    async def load(self) -> None:
        started = time.monotonic()
        try:
            await self.pool.start()
        except LoadError as e:
            self.state, self.reason = "UNAVAILABLE", str(e)
            log.error("failed to load '%s' version %d: %s", self.name, self.version, e)
            return
        self.state, self.reason = "READY", ""
        self.load_seconds = time.monotonic() - started
        log.info("successfully loaded '%s' version %d in %.2fs", self.name, self.version, self.load_seconds)

    async def retire(self, timeout: float) -> None:
        """Finish what is queued and in flight (no new requests reach a retired version), then stop."""
        self.state = "UNLOADING"
        try:
            await asyncio.wait_for(self.scheduler.drained(), timeout)
        except asyncio.TimeoutError:
            log.warning("'%s' version %d still had requests after %.0fs; stopping it anyway", self.name,
                        self.version, timeout)
        await self.stop(time.monotonic() + timeout)
        log.info("successfully unloaded '%s' version %d", self.name, self.version)

    async def stop(self, deadline: float) -> None:
        self.scheduler.fail_all(unavailable(f"model '{self.name}' version {self.version} is unloading"))
        if isinstance(self.scheduler, Scheduler):
            self.scheduler.close()
        # last, so that a thread that sees the state (the in-process API's) sees the timer closed too
        self.state = "UNAVAILABLE"
        self.reason = "unloaded"
        await self.pool.stop(deadline)


def _execution_timeout(config: mc.ModelConfig, default: float) -> float:
    """The model's `execution_timeout_secs` parameter, else the server's --execution-timeout-secs."""
    value = config.parameters["execution_timeout_secs"].string_value if "execution_timeout_secs" in \
        config.parameters else ""
    try:
        return float(value) if value else default
    except ValueError:
        return default


def _queue_policy(p) -> QueuePolicy:
    return QueuePolicy(p.max_queue_size, p.timeout_action == mc.ModelQueuePolicy.DELAY,
                       p.default_timeout_microseconds, p.allow_timeout_override)


def priorities_of(config: mc.ModelConfig) -> Priorities:
    """The dynamic batcher's priority levels and queue policies."""
    if not config.HasField("dynamic_batching"):
        return Priorities()
    db = config.dynamic_batching
    default = _queue_policy(db.default_queue_policy) if db.HasField("default_queue_policy") else QueuePolicy()
    return Priorities(db.priority_levels, db.default_priority_level, default,
                      {level: _queue_policy(p) for level, p in db.priority_queue_policy.items()})


def instance_specs(config: mc.ModelConfig, workers: str, gpus: list[int], backend: str = "",
                   host_policies: dict[str, dict[str, str]] | None = None) -> list[InstanceSpec]:
    """Expand the instance groups (filling a default group from --workers) into instances, each placed
    by its host policy (`host_policies`, --host-policy). The default group and KIND_AUTO groups go to
    the GPUs only where `backend` can use them (tritonmp.backends)."""
    placeable = gpus if not backend or backends.gpu_capable(backend) else []  # for the default and KIND_AUTO groups
    if gpus and not placeable and (
            not config.instance_group
            or any(g.kind == mc.ModelInstanceGroup.KIND_AUTO for g in config.instance_group)):
        log.info("model '%s': %s, so its %s instances run on the CPU", config.name, backends.why_not_gpu(backend),
                 "KIND_AUTO" if config.instance_group else "default")
    if not config.instance_group:
        total = (len(placeable) or 1) if workers == "auto" else int(workers)
        if placeable:
            # `total` instances spread over the GPUs, one group per GPU (Triton's count is per GPU)
            for i, gpu in enumerate(placeable[:total]):
                group = config.instance_group.add()
                group.kind = mc.ModelInstanceGroup.KIND_GPU
                group.count = total // len(placeable) + (1 if i < total % len(placeable) else 0)
                group.gpus.append(gpu)
        else:
            group = config.instance_group.add()
            group.kind = mc.ModelInstanceGroup.KIND_CPU
            group.count = total
        if len(config.instance_group) == 1:
            config.instance_group[0].name = config.name  # Triton names its default group after the model
        cfg.normalize(config)
    policies = host_policies or {}
    specs = []
    for group in config.instance_group:
        kind = group.kind
        if kind == mc.ModelInstanceGroup.KIND_AUTO:
            kind = mc.ModelInstanceGroup.KIND_GPU if placeable else mc.ModelInstanceGroup.KIND_CPU
            group.kind = kind
        if kind == mc.ModelInstanceGroup.KIND_GPU:
            devices = list(group.gpus) or gpus
            if not gpus:
                raise LoadError(f"instance group '{group.name}' asks for KIND_GPU, but no GPU is visible; "
                                "use KIND_CPU or KIND_AUTO")
            for d in devices:
                if d not in gpus:
                    raise LoadError(f"instance group '{group.name}' names GPU {d}, which is not visible "
                                    f"(visible: {gpus})")
            if not group.gpus:
                group.gpus.extend(devices)
            k = 0
            for d in devices:
                for _ in range(group.count):
                    specs.append(InstanceSpec(f"{group.name}_{k}", "GPU", d, _placement(group, "GPU", d, policies),
                                              demand_of(group, d)))
                    k += 1
        elif kind == mc.ModelInstanceGroup.KIND_MODEL:
            # the model places itself: its instances see every GPU the server sees
            place = _placement(group, "MODEL", 0, policies)
            specs += [InstanceSpec(f"{group.name}_{k}", "MODEL", 0, place, demand_of(group, 0))
                      for k in range(group.count)]
        else:
            specs += [InstanceSpec(f"{group.name}_{k}", "CPU", 0, _placement(group, "CPU", 0, policies),
                                   demand_of(group, 0)) for k in range(group.count)]
    return specs


def latency_recorder(settings: ServerSettings, config: mc.ModelConfig) -> LatencyRecorder | None:
    """A version's summaries and first-response histogram, where --metrics-config asks for them."""
    if not settings.metrics.recording:
        return None
    return LatencyRecorder(settings.metrics, first_response_buckets(config),
                           request_summary=not config.response_cache.enable)


def _placement(group: mc.ModelInstanceGroup, kind: str, device: int,
               policies: dict[str, dict[str, str]]) -> host_policy.Placement:
    """Where an instance of `group` runs: the host policy the group names, else Triton's default one."""
    name = group.host_policy or host_policy.default_name(kind, device)
    try:
        if kind == "GPU" and name not in policies and not group.host_policy:
            return host_policy.gpu_default(gpus.numa_node(device))
        return host_policy.placement(policies, name, named=bool(group.host_policy))
    except host_policy.HostPolicyError as e:
        raise LoadError(f"instance group '{group.name}': {e}") from None
