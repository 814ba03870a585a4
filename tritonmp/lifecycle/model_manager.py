"""The models this server serves: load, reload and unload them from the repositories
(repositories.py), keep each version's state (LOADING, READY, UNAVAILABLE with a reason), poll for
changes, load a model on its first request where models load on demand (acting on the residency
policy, residency.py), and find the version a request is for.

Models are known by their key (model_table.py), so that with --model-namespacing models of one name
in several repositories load side by side; a name a call gives becomes a key there."""

from __future__ import annotations

import asyncio
import time

from ..errors import ServerError, Status, invalid, not_found, unavailable
from ..instances.pool import LoadError, ModelServices
from ..instances.rate_limiter import RateLimiter
from ..instances.templates import WorkerTemplates
from ..ipc.busy_poll import BusyPoll
from ..logs import get_logger
from ..repository import config as cfg
from ..repository.problems import ConfigProblem
from ..repository.python_envs import Environments
from ..served import ServedVersion
from ..settings import ServerSettings
from .ensemble_version import EnsembleVersion
from .model_table import ModelEntry, ModelTable, parse_version
from .model_version import ModelVersion, instance_specs, latency_recorder
from .repositories import Repositories, check_load_name, poll_failed, valid_model_name, write_files
from .residency import Residency, pss_bytes

log = get_logger("models")

__all__ = ["ModelManager", "NotResident", "parse_version"]


class ModelManager(ModelTable):
    """Loads, reloads and unloads models; `models` maps a model key to what is served under it."""

    def __init__(self, settings: ServerSettings):
        super().__init__(Repositories(settings.repositories, settings.model_namespacing), settings.model_namespacing)
        self.settings = settings
        self.busy_poll = BusyPoll(settings.busy_poll_us)  # one window for the server's loop
        # --rate-limit=execution_count: one for the whole server, across models
        self.limiter = RateLimiter(settings.rate_limit_resources) if settings.rate_limit else None
        self._retiring: set[asyncio.Task] = set()
        self.retiring: set[ServedVersion] = set()  # replaced or unloaded, finishing their requests
        # what the models' own calls reach (the server API's infer, infer_stream and model_call, lent by
        # ServerApi.serve_models) and python models' own metric families: one for every model version
        self.services = ModelServices()
        self.templates = WorkerTemplates() if settings.worker_start == "fork" else None  # where workers fork from
        # python models' own environments (EXECUTION_ENV_PATH): unpacked once, each probed once
        self.environments = Environments(settings.python_env_cache, settings.python_env_from_requirements)
        self._startup: dict[str, asyncio.Task] = {}  # loads under way at startup, by model key
        # --load-on-demand: models load when first asked for, the least recently used unloaded past the budget
        self.residency = Residency(settings.max_resident_models, settings.max_resident_memory_bytes) \
            if settings.load_on_demand else None
        self._loading: dict[str, asyncio.Task[None]] = {}  # models loading on demand, by key
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
        missing = []
        if names is None or "*" in names:
            wanted = sorted(found)
        else:  # a name stands for each model of that name
            # (or the model of that key: with --model-namespacing, a name may be given as its key)
            held = {n: self.repositories.keys_named(n) or ([n] if n in found else []) for n in names}
            wanted = [k for n in names for k in held[n]]
            missing = [n for n in names if not held[n]]
        if self.residency is not None:
            wanted = [] if names is None else wanted
        for key in found:
            self._entry_for(key, found[key][0])
        for name in missing:  # Triton's words for a startup model no repository holds
            self._entry_for(name, "").problem = f"Invalid model name '{name}'" if not name else \
                f"failed to poll model '{name}': model not found in any model repository."

        async def one(key):
            try:
                await self._load(key)
            except ServerError as e:
                entry = self._entry_for(key, "")
                if not entry.versions:
                    entry.problem = e.message

        loop = asyncio.get_running_loop()
        self._startup = {k: loop.create_task(one(k)) for k in wanted}
        await asyncio.gather(*self._startup.values())
        self._startup = {}

    async def ensure_loaded(self, name: str, near: str = "") -> None:
        """For an ensemble (of namespace `near`): wait for a composing model being loaded, or load it
        when it is not."""
        key = self.find(name, near, repositories=True)
        task = self._startup.get(key)
        if task is not None:
            await asyncio.shield(task)
        entry = self.models.get(key)
        if entry is not None and entry.versions:
            return
        await self._load(key)

    def dependents(self, name: str) -> list[str]:
        """The loaded ensembles that have `name` as a step, by name."""
        return [e.name for e in self.models.values()
                if any(isinstance(mv, EnsembleVersion) and name in dict(mv.composing()) for mv in e.versions.values())]

    def composing(self, name: str) -> list[str]:
        """The models the loaded ensembles `name` run (none for other models), by name."""
        return sorted({step for key in self.keys_named(name) if key in self.models
                       for mv in self.models[key].versions.values() if isinstance(mv, EnsembleVersion)
                       for step, _ in mv.composing()})

    async def load(self, name: str, config_override: str | None = None, files: dict[str, bytes] | None = None
                   ) -> None:
        """Load or reload the model `name` (with namespacing, each model of that name), as `_load`;
        the failures of several are raised together."""
        check_load_name(name)
        if files or not self.namespacing:
            await self._load(name, config_override, files)
            return
        failures = []
        for key in self.keys_named(name):
            try:
                await self._load(key, config_override)
            except ServerError as e:
                failures.append(e)
        if len(failures) == 1:
            raise failures[0]
        if failures:
            raise ServerError(";\n".join(e.message for e in failures), failures[0].status)

    async def _load(self, key: str, config_override: str | None = None, files: dict[str, bytes] | None = None
                    ) -> None:
        """Load or reload the model `key`. The new versions must all be READY before they replace the
        old ones, which then finish their queued and in-flight requests and stop. On failure the old
        versions keep serving and the reason is raised."""
        name = self.repositories.identity(key)[1]
        if files:
            if config_override is None:
                raise poll_failed(name, "Load parameter 'config' must be specified for model file override")
            if not valid_model_name(name):
                raise invalid(f"failed to load '{name}': not a valid model name")
            files_dir, path = write_files(name, files)
        else:
            files_dir, path = await self.repositories.localize(key)
        entry = self._entry_for(key, path)
        async with entry.lock:
            failed: dict[int, str] = {}
            try:
                new = await self._start_with_retries(entry, path, config_override, failed)
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
            self.residency.loaded(key, sum(pss_bytes(i.pid) for mv in entry.versions.values()
                                            for i in mv.instances() if i.pid is not None))

    async def _start_with_retries(self, entry: ModelEntry, path: str, override: str | None,
                                  failed: dict[int, str]) -> dict[int, ServedVersion]:
        """`_start_versions`, tried again after a failure as many times as --model-load-retry-count says."""
        for attempt in range(self.settings.load_retries + 1):
            failed.clear()
            try:
                return await self._start_versions(entry, path, override, failed)
            except ServerError as e:
                if attempt == self.settings.load_retries:
                    raise
                log.warning("load of '%s' failed (%s); trying again (%d of %d)", entry.key, e.message, attempt + 1,
                            self.settings.load_retries)
        raise AssertionError("unreachable: the last attempt returns or raises")

    def _load_slots(self) -> asyncio.Semaphore:
        """The loads that may run at once (--model-load-thread-count), made on the loop that loads."""
        if self._slots is None:
            self._slots = asyncio.Semaphore(self.settings.load_threads)
        return self._slots

    async def _start_versions(self, entry: ModelEntry, path: str, override: str | None,
                              failed: dict[int, str]) -> dict[int, ServedVersion]:
        """The versions of a model, loaded and READY; else a ServerError, with each version that failed
        to start and why in `failed`. Its config and its workers' starts each take one of the load
        slots; an ensemble's versions take none (they wait for the models they compose, which do)."""
        name, namespace = entry.name, entry.namespace
        try:
            # off the loop: completing a config may run the model's own code or framework in a
            # short-lived process (seconds, for TensorFlow), and the server serves on meanwhile
            async with self._load_slots():
                completed = await asyncio.to_thread(cfg.load, path, self.settings.auto_complete, override,
                                                    self.settings.default_max_batch_sizes,
                                                    self.settings.config_name, name,
                                                    self.settings.backend_directory, self.environments)
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
                new[v] = EnsembleVersion(name, v, completed, self, self.services, namespace,
                                         latency_recorder(self.settings, completed.config))
            await asyncio.gather(*(mv.load() for mv in new.values()))
        else:
            for v in versions:
                new[v] = ModelVersion(name, v, completed, specs, self.settings, self.services, self.busy_poll,
                                      self.templates, namespace, self.limiter)
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
        """Stop serving the model `name` (with namespacing, each model of that name), as `_unload`."""
        for key in self.keys_named(name):
            await self._unload(key, reason)

    async def _unload(self, key: str, reason: str = "unloaded") -> None:
        """Stop serving a model; its queued and in-flight requests finish first. Unknown: no error.
        `reason`: what the repository index says of its versions."""
        entry = self.models.get(key)
        if entry is None:
            return
        async with entry.lock:
            old, files_dir = entry.versions, entry.files_dir
            entry.versions, entry.files_dir = {}, ""
            entry.down.update(dict.fromkeys(old, reason))
            self._retire(list(old.values()), files_dir)
        if self.residency is not None:
            self.residency.unloaded(key)
        log.info("unloading '%s'", key)

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
        for key in sorted(set(seen) | set(now)):
            if key not in now:
                await self._unload(key)
            elif seen.get(key) != now[key]:
                try:
                    await self._load(key)
                    log.info("reloaded '%s' after a change in the repository", key)
                except ServerError:
                    pass  # logged by load(); the old versions keep serving
        return now

    def entry(self, name: str, near: str = "") -> ModelEntry:
        entry = self.models.get(self.find(name, near))
        if entry is None:
            raise not_found(f"Request for unknown model: '{name}' is not found")
        return entry

    async def resolve(self, name: str, version: str = "", near: str = "") -> ServedVersion:
        """`get`, after loading the model where it is not resident (--load-on-demand)."""
        try:
            return self.get(name, version, near)
        except NotResident:
            await self._resident(self.find(name, near))
            return self.get(name, version, near)

    # -- loading on demand (--load-on-demand) ----------------------------------------------
    async def _resident(self, key: str) -> None:
        """Load the model `key` of the repositories if it is not resident, and wait for it (up to
        --load-on-demand-timeout-secs); a load already under way for another request is waited for,
        not started again."""
        task = self._loading.get(key)
        if task is None:
            task = self._loading[key] = asyncio.get_running_loop().create_task(self._load_on_demand(key))
            task.add_done_callback(lambda _: self._loading.pop(key, None))
        self._waiting[key] = self._waiting.get(key, 0) + 1
        wait = self.settings.load_on_demand_wait
        try:
            await asyncio.wait_for(asyncio.shield(task), wait if wait > 0 else None)
        except asyncio.TimeoutError:
            raise ServerError(f"model '{self.repositories.identity(key)[1]}' was not loaded within {wait:g}s of "
                              "the request (--load-on-demand-timeout-secs); its load goes on",
                              Status.UNAVAILABLE) from None
        finally:
            left = self._waiting[key] - 1
            if left:
                self._waiting[key] = left
            else:
                del self._waiting[key]

    async def _load_on_demand(self, key: str) -> None:
        residency = self.residency
        assert residency is not None, "only where models load on demand"
        if key not in self.models and not self.repositories.in_repository(key):
            await self.repositories.refresh()  # it may have been put in an object store since its last listing
            if not self.repositories.in_repository(key):
                raise not_found(f"Request for unknown model: '{self.repositories.identity(key)[1]}' is not found")
        for victim in residency.victims(key, self._in_use):
            log.info("unloading '%s' to make room for '%s' (least recently used)", victim, key)
            residency.evictions += 1
            await self._unload(victim, "unloaded: least recently used, to make room (--load-on-demand loads it "
                                       "again on its next request)")
        started = time.monotonic()
        await self._load(key)
        residency.loads += 1
        log.info("loaded '%s' on demand in %.2fs (%d resident)", key, time.monotonic() - started,
                 len(residency.lru))

    async def release(self, name: str, why: str) -> bool:
        """Unload a model resident on demand now, as a router that places models asks (Ray Serve's
        model multiplexing, when it drops the model from this replica); one in use or loading stays,
        for the budget to unload when it is not. Whether it was unloaded."""
        key = self.find(name)
        if self.residency is None or key not in self.residency.lru or key in self._loading or self._in_use(key):
            return False
        log.info("unloading '%s': %s", key, why)
        await self._unload(key, f"unloaded: {why} (--load-on-demand loads it again on its next request)")
        return True

    def _in_use(self, key: str) -> bool:
        """Requests waiting for its load, queued or running, sequences open, or an ensemble that runs it
        loaded."""
        if key in self._waiting:
            return True
        entry = self.models.get(key)
        if entry is None:
            return False
        if any(mv.scheduler.busy() or mv.scheduler.keeps_state() for mv in entry.versions.values()):
            return True
        return bool(self.dependents(entry.name))

    def residency_summary(self) -> dict | None:
        """The residency for the status document; None where models do not load on demand."""
        return self.residency.summary(list(self._loading)) if self.residency is not None else None

    def get(self, name: str, version: str = "", near: str = "") -> ServedVersion:
        """The ready model version a request is for (the highest ready one without a version), as
        Triton finds it: INVALID_ARG for a version string that is no version or an ambiguous name
        (`find`; `near`: the caller's namespace), NOT_FOUND for an unknown model or version,
        UNAVAILABLE for a known version that is not ready. With --load-on-demand, NotResident for a
        model of the repositories that has no version loaded (`resolve` loads it)."""
        number = parse_version(version) if version else -1
        key = self.find(name, near) if self.namespacing else name
        residency = self.residency
        if residency is not None:
            entry_or_none = self.models.get(key)
            if entry_or_none is None or not entry_or_none.versions:
                # an unknown name may be a model put in an object store since its last listing
                if entry_or_none is not None or self.repositories.in_repository(key) or self.repositories.remote:
                    raise NotResident(f"model '{name}' is not loaded: it loads on its first request "
                                      "(--load-on-demand)")
            else:
                residency.used(key)
        entry = self.models.get(key)
        if entry is None:
            raise not_found(f"Request for unknown model: '{name}' is not found")
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
