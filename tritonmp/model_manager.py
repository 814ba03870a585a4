"""The models this server serves: read the repositories, start each served version's instances,
keep its state (LOADING, READY, UNAVAILABLE with a reason), and find a model for a request."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from dataclasses import dataclass, field

from tritonclient.grpc import model_config_pb2 as mc

from . import config as cfg
from .config import ConfigProblem
from .errors import not_found, unavailable
from .pool import InstancePool, InstanceSpec, LoadError
from .scheduler import BatchPolicy, Scheduler
from .validation import TensorConfig

log = logging.getLogger("tritonmp.models")


@dataclass
class ServerOptions:
    repositories: list[str]
    workers: str = "auto"  # "auto" or a count
    auto_complete: bool = True
    arena_bytes: int = 64 << 20
    log_verbose: int = 0
    gpus: list[int] = field(default_factory=list)


class ModelVersion:
    def __init__(self, name: str, version: int, completed: cfg.Completed, specs: list[InstanceSpec],
                 options: ServerOptions):
        self.name = name
        self.version = version
        self.config = completed.config
        self.backend = completed.backend
        self.state = "LOADING"
        self.reason = ""
        c = completed.config
        self.max_batch_size = c.max_batch_size
        self.inputs = {t.name: TensorConfig(t.name, cfg.tensor_datatype(t), tuple(t.dims), t.optional)
                       for t in c.input}
        self.outputs = {t.name: cfg.tensor_datatype(t) for t in c.output}
        self.config_json = cfg.to_json(c)
        self.pool = InstancePool(name, version, completed.model_dir, completed.backend,
                                 json.dumps(self.config_json), specs, self.outputs, options.arena_bytes,
                                 options.log_verbose)
        db = c.dynamic_batching if c.HasField("dynamic_batching") else None
        policy = BatchPolicy(c.max_batch_size, db is not None,
                             list(db.preferred_batch_size) if db else [],
                             (db.max_queue_delay_microseconds if db else 0) * 1000)
        self.scheduler = Scheduler(self.pool, policy)

    async def load(self) -> None:
        started = time.monotonic()
        try:
            await self.pool.start()
        except LoadError as e:
            self.state, self.reason = "UNAVAILABLE", str(e)
            log.error("failed to load '%s' version %d: %s", self.name, self.version, e)
            return
        self.state, self.reason = "READY", ""
        log.info("successfully loaded '%s' version %d in %.2fs", self.name, self.version,
                 time.monotonic() - started)

    async def stop(self, deadline: float) -> None:
        self.state = "UNAVAILABLE"
        self.reason = "unloaded"
        self.scheduler.fail_all(unavailable(f"model '{self.name}' version {self.version} is unloading"))
        await self.pool.stop(deadline)


@dataclass
class ModelEntry:
    name: str
    path: str
    versions: dict[int, ModelVersion] = field(default_factory=dict)
    problem: str = ""  # why the model could not be loaded at all
    platform: str = ""


def instance_specs(config: mc.ModelConfig, workers: str, gpus: list[int]) -> list[InstanceSpec]:
    """Expand the instance groups (filling a default group from --workers) into instances."""
    if not config.instance_group:
        total = (len(gpus) or 1) if workers == "auto" else int(workers)
        if gpus:
            # `total` instances spread over the GPUs, one group per GPU (Triton's count is per GPU)
            for i, gpu in enumerate(gpus[:total]):
                group = config.instance_group.add()
                group.kind = mc.ModelInstanceGroup.KIND_GPU
                group.count = total // len(gpus) + (1 if i < total % len(gpus) else 0)
                group.gpus.append(gpu)
        else:
            group = config.instance_group.add()
            group.kind = mc.ModelInstanceGroup.KIND_CPU
            group.count = total
        cfg.normalize(config)
    specs = []
    for group in config.instance_group:
        kind = group.kind
        if kind == mc.ModelInstanceGroup.KIND_AUTO:
            kind = mc.ModelInstanceGroup.KIND_GPU if gpus else mc.ModelInstanceGroup.KIND_CPU
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
                    specs.append(InstanceSpec(f"{group.name}_{k}", "GPU", d))
                    k += 1
        else:
            specs += [InstanceSpec(f"{group.name}_{k}", "CPU", 0) for k in range(group.count)]
    return specs


class ModelManager:
    def __init__(self, options: ServerOptions):
        self.options = options
        self.models: dict[str, ModelEntry] = {}

    def discover(self) -> list[ModelEntry]:
        entries = []
        seen: dict[str, str] = {}
        for repo in self.options.repositories:
            for name in sorted(os.listdir(repo)):
                path = os.path.join(repo, name)
                if not os.path.isdir(path) or name.startswith("."):
                    continue
                entry = ModelEntry(name, path)
                if name in seen:
                    entry.problem = f"model '{name}' appears in two repositories: {seen[name]} and {repo}"
                seen[name] = repo
                entries.append(entry)
        return entries

    async def load_all(self) -> None:
        loads = []
        for entry in self.discover():
            self.models[entry.name] = entry
            if entry.problem:
                log.error("failed to load '%s': %s", entry.name, entry.problem)
                continue
            try:
                completed = cfg.load(entry.path, self.options.auto_complete)
                specs = instance_specs(completed.config, self.options.workers, self.options.gpus)
            except (ConfigProblem, LoadError) as e:
                entry.problem = str(e)
                log.error("failed to load '%s': %s", entry.name, e)
                continue
            entry.platform = completed.config.platform or completed.backend
            for v in cfg.version_is_wanted(completed.config, completed.versions):
                mv = ModelVersion(entry.name, v, completed, specs, self.options)
                entry.versions[v] = mv
                loads.append(mv.load())
            if not entry.versions:
                entry.problem = "the version policy selects no version that is present"
        await asyncio.gather(*loads)

    def all_ready(self) -> bool:
        return all(not e.problem and e.versions and all(v.state == "READY" for v in e.versions.values())
                   for e in self.models.values())

    def failures(self) -> list[str]:
        out = []
        for e in self.models.values():
            if e.problem:
                out.append(f"{e.name}: {e.problem}")
            for v in e.versions.values():
                if v.state != "READY":
                    out.append(f"{e.name} version {v.version}: {v.reason}")
        return out

    def entry(self, name: str) -> ModelEntry:
        entry = self.models.get(name)
        if entry is None:
            raise not_found(f"Request for unknown model: '{name}' is not found")
        return entry

    def get(self, name: str, version: str = "") -> ModelVersion:
        """The ready model version a request is for; NOT_FOUND or UNAVAILABLE otherwise."""
        entry = self.entry(name)
        if version:
            mv = entry.versions.get(int(version)) if version.isdigit() else None
            if mv is None:
                raise not_found(f"Request for unknown model: '{name}' version {version} is not found")
            if mv.state != "READY":
                raise unavailable(f"Request for unknown model: '{name}' version {version} is not at ready "
                                  "state")
            return mv
        for v in sorted(entry.versions, reverse=True):
            if entry.versions[v].state == "READY":
                return entry.versions[v]
        raise unavailable(f"Request for unknown model: '{name}' has no available versions")

    def find(self, name: str, version: str = "") -> ModelVersion:
        """A model version in any state (for metadata and config); the highest one without a version."""
        entry = self.entry(name)
        if version:
            mv = entry.versions.get(int(version)) if version.isdigit() else None
            if mv is None:
                raise not_found(f"Request for unknown model: '{name}' version {version} is not found")
            return mv
        try:
            return self.get(name)
        except Exception:
            if not entry.versions:
                raise unavailable(f"Request for unknown model: '{name}' has no available versions") from None
            return entry.versions[max(entry.versions)]

    async def stop(self, deadline: float) -> None:
        await asyncio.gather(*(v.stop(deadline) for e in self.models.values() for v in e.versions.values()))
