"""The models this server serves: load, reload and unload them from the repositories
(repositories.py), keep each version's state (LOADING, READY, UNAVAILABLE with a reason), poll for
changes, load a model on its first request where models load on demand (acting on the residency
policy, residency.py), and find the version a request is for."""

from __future__ import annotations

import asyncio
import re
import time
from dataclasses import dataclass, field

from ..errors import ServerError, Status, invalid, not_found, unavailable
from ..instances.pool import LoadError, ModelServices
from ..instances.templates import WorkerTemplates
from ..ipc.busy_poll import BusyPoll
from ..logs import get_logger
from ..repository import config as cfg
from ..repository.problems import ConfigProblem
from ..served import ServedVersion
from ..settings import ServerSettings
from .ensemble_version import EnsembleVersion
from .model_version import ModelVersion, instance_specs
from .repositories import Repositories, poll_failed, valid_model_name, write_files
from .residency import Residency, pss_bytes

log = get_logger("models")

_VERSION = re.compile(r"[ \t\n\v\f\r]*([+-]?[0-9]+)")  # what C's strtol reads: space, a sign, digits
_LONG = 1 << 63
_VERSIONS: dict[str, int] = {}  # version string -> its number: clients send the same few
_KEPT = 1024


def parse_version(text: str) -> int:
    """A request's model version string as Triton reads it (std::stol: leading space, a sign and
    digits; anything after them is ignored), -1 for the empty string. INVALID_ARG, with Triton's
    words, for a string with no number, one out of a 64-bit range, or a negative one."""
    number = _VERSIONS.get(text)
    if number is not None:
        return number
    if not text:
        return -1
    match = _VERSION.match(text)
    number = int(match.group(1)) if match else _LONG
    if not -_LONG <= number < _LONG:
        raise invalid(f"failed to get model version from specified version string '{text}' (details: stol), "
                      "version should be an integral value > 0")
    if number < 0:
        raise invalid(f"invalid model version specified '{text}' , version should be an integral value > 0")
    if len(_VERSIONS) >= _KEPT:
        _VERSIONS.clear()
    _VERSIONS[text] = number
    return number


@dataclass
class ModelEntry:
    name: str
    path: str
    versions: dict[int, ServedVersion] = field(default_factory=dict)  # the versions being served
    problem: str = ""  # why the model could not be loaded at all
    platform: str = ""
    down: dict[int, str] = field(default_factory=dict)  # versions known but not served -> why (unloaded, failed)
    files_dir: str = ""  # a private directory holding files sent with a load request
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


class ModelManager:
    """Loads, reloads and unloads models; `models` maps a name to what is served under it."""

    def __init__(self, settings: ServerSettings):
        self.settings = settings
        self.repositories = Repositories(settings.repositories)
        self.busy_poll = BusyPoll(settings.busy_poll_us)  # one window for the server's loop
        self.models: dict[str, ModelEntry] = {}
        self._retiring: set[asyncio.Task] = set()
        self.retiring: set[ServedVersion] = set()  # replaced or unloaded, finishing their requests
        # what the models' own calls reach (the server API's infer, infer_stream and model_call, lent by
        # ServerApi.serve_models) and python models' own metric families: one for every model version
        self.services = ModelServices()
        self.templates = WorkerTemplates() if settings.worker_start == "fork" else None  # where workers fork from
        self._startup: dict[str, asyncio.Task] = {}  # loads under way at startup, by model name
        # --load-on-demand: models load when first asked for, the least recently used unloaded past the budget
        self.residency = Residency(settings.max_resident_models, settings.max_resident_memory_bytes) \
            if settings.load_on_demand else None
        self._loading: dict[str, asyncio.Task[None]] = {}  # models loading on demand
        self._slots: asyncio.Semaphore | None = None  # see _load_slots
        # requests waiting for a model's load: it is in use until they have gone on to queue (which
        # they do in the same turn of the loop as their wait ends)
        self._waiting: dict[str, int] = {}

    # -- loading and unloading -------------------------------------------------------------
    async def load_all(self, names: list[str] | None = None) -> None:
        """Startup: load every model (or the named ones), recording failures instead of raising. With
        --load-on-demand, only the named ones: the others load when first asked for."""
        await self.repositories.refresh()
        found = self.repositories.discover()
        wanted = sorted(found) if names is None or "*" in names else names
        if self.residency is not None:
            wanted = [] if names is None else wanted
        for name in found:
            self.models.setdefault(name, ModelEntry(name, found[name][0]))

        async def one(name):
            try:
                await self.load(name)
            except ServerError as e:
                entry = self.models.setdefault(name, ModelEntry(name, ""))
                if not entry.versions:
                    entry.problem = e.message

        loop = asyncio.get_running_loop()
        self._startup = {n: loop.create_task(one(n)) for n in wanted}
        await asyncio.gather(*self._startup.values())
        self._startup = {}

    async def ensure_loaded(self, name: str) -> None:
        """For an ensemble: wait for a composing model being loaded, or load it when it is not."""
        task = self._startup.get(name)
        if task is not None:
            await asyncio.shield(task)
        entry = self.models.get(name)
        if entry is not None and entry.versions:
            return
        await self.load(name)

    def dependents(self, name: str) -> list[str]:
        """The loaded ensembles that have `name` as a step."""
        return [e.name for e in self.models.values()
                if any(isinstance(mv, EnsembleVersion) and name in dict(mv.composing()) for mv in e.versions.values())]

    def composing(self, name: str) -> list[str]:
        """The models a loaded ensemble `name` runs (none for other models)."""
        entry = self.models.get(name)
        if entry is None:
            return []
        return sorted({step for mv in entry.versions.values() if isinstance(mv, EnsembleVersion)
                       for step, _ in mv.composing()})

    async def load(self, name: str, config_override: str | None = None, files: dict[str, bytes] | None = None
                   ) -> None:
        """Load or reload a model. The new versions must all be READY before they replace the old
        ones, which then finish their queued and in-flight requests and stop. On failure the old
        versions keep serving and the reason is raised."""
        if files:
            if config_override is None:
                raise poll_failed(name, "Load parameter 'config' must be specified for model file override")
            if not valid_model_name(name):
                raise invalid(f"failed to load '{name}': not a valid model name")
            files_dir, path = write_files(name, files)
        else:
            files_dir, path = await self.repositories.localize(name)
        entry = self.models.setdefault(name, ModelEntry(name, path))
        async with entry.lock:
            failed: dict[int, str] = {}
            try:
                new = await self._start_with_retries(name, path, config_override, failed)
            except ServerError as e:
                if files_dir:
                    self.repositories.remove_copy(files_dir)
                log.error("%s", e.message)
                message = self.repositories.public(name, e.message, files_dir)
                if entry.versions:
                    for mv in entry.versions.values():
                        mv.reason = f"a later load failed, this version keeps serving: {message}"
                else:
                    entry.problem = message
                    entry.down.update({v: self.repositories.public(name, why, files_dir) for v, why in failed.items()})
                raise ServerError(message, e.status) from None
            old, old_dir = entry.versions, entry.files_dir
            entry.versions, entry.path, entry.files_dir = new, path, files_dir
            entry.problem, entry.down = "", {}
            first = next(iter(new.values()))
            entry.platform = first.config.platform or first.backend
            self._retire(list(old.values()), old_dir)
        if self.residency is not None:
            self.residency.loaded(name, sum(pss_bytes(i.pid) for mv in entry.versions.values()
                                            for i in mv.instances() if i.pid is not None))

    async def _start_with_retries(self, name: str, path: str, override: str | None,
                                  failed: dict[int, str]) -> dict[int, ServedVersion]:
        """`_start_versions`, tried again after a failure as many times as --model-load-retry-count says."""
        for attempt in range(self.settings.load_retries + 1):
            failed.clear()
            try:
                return await self._start_versions(name, path, override, failed)
            except ServerError as e:
                if attempt == self.settings.load_retries:
                    raise
                log.warning("load of '%s' failed (%s); trying again (%d of %d)", name, e.message, attempt + 1,
                            self.settings.load_retries)
        raise AssertionError("unreachable: the last attempt returns or raises")

    def _load_slots(self) -> asyncio.Semaphore:
        """The loads that may run at once (--model-load-thread-count), made on the loop that loads."""
        if self._slots is None:
            self._slots = asyncio.Semaphore(self.settings.load_threads)
        return self._slots

    async def _start_versions(self, name: str, path: str, override: str | None,
                              failed: dict[int, str]) -> dict[int, ServedVersion]:
        """The versions of a model, loaded and READY; else a ServerError, with each version that failed
        to start and why in `failed`. Its config and its workers' starts each take one of the load
        slots; an ensemble's versions take none (they wait for the models they compose, which do)."""
        try:
            # off the loop: completing a config may run the model's own code or framework in a
            # short-lived process (seconds, for TensorFlow), and the server serves on meanwhile
            async with self._load_slots():
                completed = await asyncio.to_thread(cfg.load, path, self.settings.auto_complete, override,
                                                    self.settings.default_max_batch_sizes,
                                                    self.settings.config_name, name)
            specs = [] if completed.backend == "ensemble" else \
                instance_specs(completed.config, self.settings.workers, self.settings.gpus, completed.backend,
                               self.settings.host_policies)
        except (ConfigProblem, LoadError) as e:
            raise invalid(f"load failed for model '{name}': {e}") from None
        versions = cfg.version_is_wanted(completed.config, completed.versions)
        if not versions:
            raise invalid(f"load failed for model '{name}': the version policy selects no version that is present")
        new: dict[int, ServedVersion] = {}
        if completed.backend == "ensemble":
            for v in versions:
                new[v] = EnsembleVersion(name, v, completed, self, self.services)
            await asyncio.gather(*(mv.load() for mv in new.values()))
        else:
            for v in versions:
                new[v] = ModelVersion(name, v, completed, specs, self.settings, self.services, self.busy_poll,
                                      self.templates)
            async with self._load_slots():
                await asyncio.gather(*(mv.load() for mv in new.values()))
        failed.update({mv.version: mv.reason for mv in new.values() if mv.state != "READY"})
        if failed:
            reasons = "".join(f"version {v} is at UNAVAILABLE state: {why};\n" for v, why in failed.items())
            await asyncio.gather(*(mv.stop(time.monotonic() + 5) for mv in new.values()))
            raise invalid(f"load failed for model '{name}': {reasons}")
        return new

    def _retire(self, versions: list[ServedVersion], files_dir: str = "") -> None:
        self.retiring.update(versions)

        async def retire():
            await asyncio.gather(*(mv.retire(self.settings.exit_timeout) for mv in versions))
            self.retiring.difference_update(versions)
            if files_dir:
                self.repositories.remove_copy(files_dir)

        if versions or files_dir:
            task = asyncio.get_running_loop().create_task(retire())
            self._retiring.add(task)
            task.add_done_callback(self._retiring.discard)

    async def unload(self, name: str, reason: str = "unloaded") -> None:
        """Stop serving a model; its queued and in-flight requests finish first. Unknown: no error.
        `reason`: what the repository index says of its versions."""
        entry = self.models.get(name)
        if entry is None:
            return
        async with entry.lock:
            old, files_dir = entry.versions, entry.files_dir
            entry.versions, entry.files_dir = {}, ""
            entry.down.update(dict.fromkeys(old, reason))
            self._retire(list(old.values()), files_dir)
        if self.residency is not None:
            self.residency.unloaded(name)
        log.info("unloading '%s'", name)

    def forget_unlisted(self) -> None:
        """Drop what is known of models that no longer serve and that no repository holds (after a
        registered repository went), so that the index no longer lists them."""
        listed = self.repositories.discover()
        for name in [n for n, e in self.models.items() if not e.versions and n not in listed and not e.lock.locked()]:
            del self.models[name]

    def index(self, ready_only: bool = False) -> list[dict]:
        rows = []
        names = set(self.repositories.discover()) | set(self.models)
        for name in sorted(names):
            entry = self.models.get(name)
            if entry is None or (not entry.versions and not entry.down and not entry.problem):
                if not ready_only:
                    rows.append({"name": name})
                continue
            for v, mv in sorted(entry.versions.items()):
                if ready_only and mv.state != "READY":
                    continue
                row = {"name": name, "version": str(v), "state": mv.state}
                if mv.reason:
                    row["reason"] = mv.reason
                rows.append(row)
            if ready_only:
                continue
            down = sorted(v for v in entry.down if v not in entry.versions)
            for v in down:
                rows.append({"name": name, "version": str(v), "state": "UNAVAILABLE", "reason": entry.down[v]})
            if entry.problem and not entry.versions and all(entry.down[v].startswith("unloaded") for v in down):
                # the load failed before any version started (else its versions' rows say why)
                rows.append({"name": name, "state": "UNAVAILABLE", "reason": entry.problem})
        return rows

    # -- polling -----------------------------------------------------------------------------
    async def poll(self, interval: float, seen: dict) -> None:
        """Watch the repositories: load new models, reload changed ones, unload removed ones, since
        `seen` (the fingerprints taken when the startup load ended: a change made after it, before
        this task's first turn, is still a change)."""
        while True:
            await asyncio.sleep(interval)
            seen = await self.poll_once(seen)

    async def poll_once(self, seen: dict) -> dict:
        """One look at the repositories since `seen` (their fingerprints then); the fingerprints now."""
        now = await self.repositories.fingerprints()
        for name in sorted(set(seen) | set(now)):
            if name not in now:
                await self.unload(name)
            elif seen.get(name) != now[name]:
                try:
                    await self.load(name)
                    log.info("reloaded '%s' after a change in the repository", name)
                except ServerError:
                    pass  # logged by load(); the old versions keep serving
        return now

    def all_ready(self) -> bool:
        return all(not e.problem and all(v.state == "READY" for v in e.versions.values())
                   for e in self.models.values() if e.versions or e.problem)

    def ready_versions(self) -> list[ServedVersion]:
        """Every model version in the READY state."""
        return [v for e in self.models.values() for v in e.versions.values() if v.state == "READY"]

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

    async def resolve(self, name: str, version: str = "") -> ServedVersion:
        """`get`, after loading the model where it is not resident (--load-on-demand)."""
        try:
            return self.get(name, version)
        except NotResident:
            await self._resident(name)
            return self.get(name, version)

    # -- loading on demand (--load-on-demand) ----------------------------------------------
    async def _resident(self, name: str) -> None:
        """Load the model `name` of the repositories if it is not resident, and wait for it (up to
        --load-on-demand-timeout-secs); a load already under way for another request is waited for,
        not started again."""
        task = self._loading.get(name)
        if task is None:
            task = self._loading[name] = asyncio.get_running_loop().create_task(self._load_on_demand(name))
            task.add_done_callback(lambda _: self._loading.pop(name, None))
        self._waiting[name] = self._waiting.get(name, 0) + 1
        wait = self.settings.load_on_demand_wait
        try:
            await asyncio.wait_for(asyncio.shield(task), wait if wait > 0 else None)
        except asyncio.TimeoutError:
            raise ServerError(f"model '{name}' was not loaded within {wait:g}s of the request "
                              "(--load-on-demand-timeout-secs); its load goes on", Status.UNAVAILABLE) from None
        finally:
            left = self._waiting[name] - 1
            if left:
                self._waiting[name] = left
            else:
                del self._waiting[name]

    async def _load_on_demand(self, name: str) -> None:
        residency = self.residency
        assert residency is not None, "only where models load on demand"
        if name not in self.models and not self.repositories.in_repository(name):
            await self.repositories.refresh()  # it may have been put in an object store since its last listing
            if not self.repositories.in_repository(name):
                raise not_found(f"Request for unknown model: '{name}' is not found")
        for victim in residency.victims(name, self._in_use):
            log.info("unloading '%s' to make room for '%s' (least recently used)", victim, name)
            residency.evictions += 1
            await self.unload(victim, "unloaded: least recently used, to make room (--load-on-demand loads it "
                                      "again on its next request)")
        started = time.monotonic()
        await self.load(name)
        residency.loads += 1
        log.info("loaded '%s' on demand in %.2fs (%d resident)", name, time.monotonic() - started,
                 len(residency.lru))

    async def release(self, name: str, why: str) -> bool:
        """Unload a model resident on demand now, as a router that places models asks (Ray Serve's
        model multiplexing, when it drops the model from this replica); one in use or loading stays,
        for the budget to unload when it is not. Whether it was unloaded."""
        if self.residency is None or name not in self.residency.lru or name in self._loading or self._in_use(name):
            return False
        log.info("unloading '%s': %s", name, why)
        await self.unload(name, f"unloaded: {why} (--load-on-demand loads it again on its next request)")
        return True

    def _in_use(self, name: str) -> bool:
        """Requests waiting for its load, queued or running, sequences open, or an ensemble that runs it
        loaded."""
        if name in self._waiting:
            return True
        entry = self.models.get(name)
        if entry is None:
            return False
        if any(mv.scheduler.busy() or mv.scheduler.keeps_state() for mv in entry.versions.values()):
            return True
        return bool(self.dependents(name))

    def residency_summary(self) -> dict | None:
        """The residency for the status document; None where models do not load on demand."""
        return self.residency.summary(list(self._loading)) if self.residency is not None else None

    def get(self, name: str, version: str = "") -> ServedVersion:
        """The ready model version a request is for (the highest ready one without a version), as
        Triton finds it: INVALID_ARG for a version string that is no version, NOT_FOUND for an unknown
        model or version, UNAVAILABLE for a known version that is not ready. With --load-on-demand,
        NotResident for a model of the repositories that has no version loaded (`resolve` loads it)."""
        number = parse_version(version) if version else -1
        residency = self.residency
        if residency is not None:
            entry_or_none = self.models.get(name)
            if entry_or_none is None or not entry_or_none.versions:
                # an unknown name may be a model put in an object store since its last listing
                if entry_or_none is not None or self.repositories.in_repository(name) or self.repositories.remote:
                    raise NotResident(f"model '{name}' is not loaded: it loads on its first request "
                                      "(--load-on-demand)")
            else:
                residency.used(name)
        entry = self.entry(name)
        if number >= 0:
            mv = entry.versions.get(number)
            if mv is None and number not in entry.down:
                raise not_found(f"Request for unknown model: '{name}' version {number} is not found")
            if mv is None or mv.state != "READY":
                raise unavailable(f"Request for unknown model: '{name}' version {number} is not at ready state")
            return mv
        if len(entry.versions) == 1:  # the common case, without sorting
            (mv,) = entry.versions.values()
            if mv.state == "READY":
                return mv
        for v in sorted(entry.versions, reverse=True):
            if entry.versions[v].state == "READY":
                return entry.versions[v]
        raise not_found(f"Request for unknown model: '{name}' has no available versions")

    async def stop(self, deadline: float) -> None:
        for task in list(self._retiring):
            task.cancel()
        versions = [v for e in self.models.values() for v in e.versions.values()] + list(self.retiring)
        await asyncio.gather(*(v.stop(deadline) for v in versions))
        if self.templates is not None:
            await self.templates.close()
        for e in self.models.values():
            if e.files_dir:
                self.repositories.remove_copy(e.files_dir)
        self.repositories.close()


class NotResident(ServerError):
    """A model of the repositories that is not loaded, where models load on demand: a caller that
    can wait loads it (ModelManager.resolve); one that cannot says it is unavailable."""

    def __init__(self, message: str):
        super().__init__(message, Status.UNAVAILABLE)
