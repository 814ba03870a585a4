"""`Server` and `Options` of the in-process API, with Triton's names, defaults and errors.

Options the server acts on are honoured; an option it has no counterpart for is accepted at its
default and refused with UnsupportedError when set to anything else, never silently ignored.
"""

from __future__ import annotations

import atexit
import dataclasses
import enum
import os
import threading
import time
import weakref
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ...errors import ServerError
from ...metrics_config import MetricsConfig, MetricsConfigError, parse_metrics_config
from ...observability.log_settings import LogSettings
from ...scheduling.response_cache import ResponseCache
from ...server_api import ServerApi
from ...settings import DEFAULTS, ServerSettings, SettingsError
from ...storage.locations import is_remote
from ...storage.remote import repository_problem
from ._engine import Engine
from ._errors import InternalError, InvalidArgumentError, UnavailableError, UnsupportedError, from_server_error
from ._model import Model
from ._shared import SharedArrays


class ModelControlMode(enum.IntEnum):
    NONE = 0
    POLL = 1
    EXPLICIT = 2


class RateLimitMode(enum.IntEnum):
    OFF = 0
    EXEC_COUNT = 1


class LogFormat(enum.IntEnum):
    DEFAULT = 0
    ISO8601 = 1


class MetricFormat(enum.IntEnum):
    PROMETHEUS = 0


class InstanceGroupKind(enum.IntEnum):
    AUTO = 0
    CPU = 1
    GPU = 2
    MODEL = 3


@dataclass
class RateLimiterResource:
    name: str
    count: int
    device: int


@dataclass
class ModelLoadDeviceLimit:
    kind: InstanceGroupKind
    device: int
    fraction: float


@dataclass
class Options:
    model_repository: str | list[str] = field(default_factory=list)
    server_id: str = "triton"
    model_control_mode: ModelControlMode = ModelControlMode.NONE
    startup_models: list[str] = field(default_factory=list)
    strict_model_config: bool = False
    rate_limiter_mode: RateLimitMode = RateLimitMode.OFF
    rate_limiter_resources: list[RateLimiterResource] = field(default_factory=list)
    pinned_memory_pool_size: int = 1 << 28
    cuda_memory_pool_sizes: dict[int, int] = field(default_factory=dict)
    cache_config: dict[str, dict[str, Any]] = field(default_factory=dict)
    cache_directory: str = "/opt/tritonserver/caches"
    min_supported_compute_capability: float = 6.0
    exit_on_error: bool = True
    strict_readiness: bool = True
    exit_timeout: int = 30
    buffer_manager_thread_count: int = 0
    model_load_thread_count: int = 4
    model_load_retry_count: int = 0
    model_namespacing: bool = False
    enable_peer_access: bool = True
    log_file: str | None = None
    log_info: bool = False
    log_warn: bool = False
    log_error: bool = False
    log_format: LogFormat = LogFormat.DEFAULT
    log_verbose: int = 0
    metrics: bool = True
    gpu_metrics: bool = True
    cpu_metrics: bool = True
    metrics_interval: int = 2000
    backend_directory: str = "/opt/tritonserver/backends"
    repo_agent_directory: str = "/opt/tritonserver/repoagents"
    model_load_device_limits: list[ModelLoadDeviceLimit] = field(default_factory=list)
    backend_configuration: dict[str, dict[str, str]] = field(default_factory=dict)
    host_policies: dict[str, dict[str, str]] = field(default_factory=dict)
    metrics_configuration: dict[str, dict[str, str]] = field(default_factory=dict)
    # tritonmp's own, beside Triton's: models loaded on demand under a budget (the command's
    # --load-on-demand, --max-resident-models, --max-resident-memory-mb, --load-on-demand-timeout-secs)
    load_on_demand: bool = DEFAULTS.load_on_demand
    max_resident_models: int = DEFAULTS.max_resident_models
    max_resident_memory_mb: int = DEFAULTS.max_resident_memory_bytes >> 20
    load_on_demand_timeout: float = DEFAULTS.load_on_demand_wait


# what each option must be (checked at start(), as Triton's bindings check them: TypeError)
_TYPES = {
    "server_id": str, "strict_model_config": bool, "exit_on_error": bool, "strict_readiness": bool,
    "exit_timeout": int, "log_info": bool, "log_warn": bool, "log_error": bool, "log_verbose": int,
    "metrics": bool, "gpu_metrics": bool, "cpu_metrics": bool, "metrics_interval": int,
    "startup_models": list, "backend_configuration": dict, "cache_config": dict,
    "load_on_demand": bool, "max_resident_models": int, "max_resident_memory_mb": int,
    "model_load_thread_count": int, "model_load_retry_count": int,
}
# options this server has no counterpart for: only their defaults are accepted
_WITHOUT_COUNTERPART = ("pinned_memory_pool_size", "cuda_memory_pool_sizes",
                        "cache_directory", "min_supported_compute_capability", "buffer_manager_thread_count",
                        "enable_peer_access",
                        "repo_agent_directory", "model_load_device_limits", "host_policies")
_DEFAULTS = Options()
_live_servers: weakref.WeakSet = weakref.WeakSet()


def _given_options(options: Options) -> dict[str, object]:
    """The Options that differ from their defaults (for the status page)."""
    default = Options()
    given: dict[str, object] = {}
    for f in dataclasses.fields(options):
        value = getattr(options, f.name)
        if value != getattr(default, f.name):
            given[f.name] = value if isinstance(value, (str, int, float, bool, type(None))) else str(value)
    return given


class Server:
    """A tritonmp server inside this program: `Server(Options(...))` or `Server(model_repository=...)`,
    then start(). Models run in worker processes of their own, as under the `tritonmp` command."""

    def __init__(self, options: Options | None = None, **kwargs: Any):
        if options is None:
            options = Options(**kwargs)
        elif kwargs:
            options = dataclasses.replace(options, **kwargs)
        self.options = options
        self._engine: Engine | None = None
        self._shared = SharedArrays()

    # -- lifecycle -------------------------------------------------------------------------
    def start(self, wait_until_ready: bool = False, polling_interval: float = 0.1,
              timeout: float | None = None) -> Server:
        if self._engine is not None:
            raise InvalidArgumentError("Server already started")
        settings, cache = self._translate(self.options)
        o = self.options
        verbose = o.log_verbose > 0  # verbose logging turns the other levels on, as in Triton
        log_settings = LogSettings(o.log_verbose, o.log_info or verbose, o.log_warn or verbose, o.log_error or verbose,
                                   "ISO8601" if o.log_format == LogFormat.ISO8601 else "default", o.log_file or "",
                                   owns_process=False)
        engine = Engine(settings, cache=cache, log_settings=log_settings)
        engine.start()
        self._engine = engine
        _live_servers.add(self)
        names = settings.load_models if settings.model_control == "explicit" else None
        if names == ["*"]:
            names = None  # every model of the repositories
        try:
            failures = engine.call(engine.load_startup(names))
        except ServerError as e:
            self.stop()
            raise from_server_error(e) from None
        if failures and self.options.exit_on_error:
            self.stop()
            raise InternalError("failed to load all models: " + "; ".join(failures))
        started = time.monotonic()
        while wait_until_ready and not self.ready() and (timeout is None or time.monotonic() - started < timeout):
            time.sleep(polling_interval)
        if wait_until_ready and not self.ready():
            raise UnavailableError("Timeout before ready")
        return self

    def stop(self) -> None:
        """Stop the models (their workers finish and exit); nothing is left in /dev/shm."""
        engine, self._engine = self._engine, None
        if engine is not None:
            engine.stop(float(self.options.exit_timeout))

    def __del__(self):
        """A server dropped without stop() stops its models when it is collected."""
        engine = getattr(self, "_engine", None)
        if engine is not None and threading.current_thread() is not engine.thread:
            self.stop()

    def __enter__(self) -> Server:
        return self if self._engine is not None else self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def _check_started(self) -> Engine:
        """The started server's engine; InvalidArgumentError where it is not started."""
        if self._engine is None:
            raise InvalidArgumentError("Server not started")
        return self._engine

    def _api(self) -> ServerApi:
        return self._check_started().api

    def _call(self, fn, *args):
        engine = self._check_started()
        try:
            return engine.run(fn, *args)
        except ServerError as e:
            raise from_server_error(e) from None

    def _await(self, coro_fn, *args):
        engine = self._check_started()
        try:
            return engine.call(coro_fn(*args))
        except ServerError as e:
            raise from_server_error(e) from None

    def shared_array(self, shape, dtype=np.float32) -> np.ndarray:
        """A numpy array (zeros) in memory that models' workers read in place: given as an input,
        whole or as a contiguous slice, it is not copied at all (an ordinary array is copied once).
        tritonmp's own, beside Triton's API. Fill it before a request and leave it unchanged until
        the response; reuse it across requests. It is freed when its last view is gone."""
        try:
            return self._shared.allocate(shape, dtype)
        except (TypeError, ValueError) as e:
            raise InvalidArgumentError(str(e)) from None

    # -- the server ------------------------------------------------------------------------
    def live(self) -> bool:
        return self._call(self._api().live)

    def ready(self) -> bool:
        return self._await(self._api().ready)

    def metadata(self) -> dict[str, Any]:
        from ... import __version__
        from ...server_api import EXTENSIONS

        self._check_started()
        return {"name": self.options.server_id, "version": __version__, "extensions": list(EXTENSIONS)}

    def metrics(self, metric_format: MetricFormat = MetricFormat.PROMETHEUS) -> str:
        if MetricFormat(metric_format) != MetricFormat.PROMETHEUS:
            raise InvalidArgumentError(f"unknown metric format {metric_format}")
        if not self.options.metrics:
            raise UnsupportedError("metrics not supported")
        api = self._api()
        system = self._system_sampler()
        return self._call(lambda: api.metrics_text(system).decode())

    def _system_sampler(self):
        from ...observability.system import SystemSampler

        engine = self._check_started()
        sampler = engine.sampler
        if sampler is None:
            settings = engine.settings
            sampler = engine.sampler = SystemSampler(settings.cpu_metrics, settings.gpu_metrics, settings.gpus)
            engine.run(sampler.sample)
        return sampler

    # -- models ----------------------------------------------------------------------------
    def model(self, model_name: str, model_version: int = -1) -> Model:
        self._check_started()
        return Model(self, model_name, model_version)

    def models(self, exclude_not_ready: bool = False) -> ModelDictionary:
        self._check_started()
        index = self._await(self._api().repository_index, exclude_not_ready)
        models = [Model(self, row["name"], int(row["version"]) if row.get("version") else -1, row.get("state"),
                        row.get("reason")) for row in index]
        return ModelDictionary(self, models)

    def load(self, model_name: str, parameters: dict[str, str | int | bool | bytes] | None = None) -> Model:
        """Load (or reload) a model; `parameters` as Triton's: `config` (JSON text) and `file:<path>`
        (bytes). Needs ModelControlMode.EXPLICIT."""
        params = dict(parameters or {})
        self._await(self._api().load_model, model_name, params)
        return self.model(model_name)

    def unload(self, model: str | Model, unload_dependents: bool = False, wait_until_unloaded: bool = False,
               polling_interval: float = 0.1, timeout: float | None = None) -> None:
        name = model.name if isinstance(model, Model) else model
        self._await(self._api().unload_model, name, {"unload_dependents": unload_dependents})
        started = time.monotonic()
        while wait_until_unloaded and (timeout is None or time.monotonic() - started < timeout):
            if all(row.get("state") in (None, "UNAVAILABLE") for row in self._await(
                    self._api().repository_index, False) if row["name"] == name):
                return
            time.sleep(polling_interval)

    def poll_model_repository(self) -> None:
        if self.options.model_control_mode != ModelControlMode.POLL:
            raise UnsupportedError("poll not supported in the current model control mode")
        self._await(self._check_started().poll)

    def register_model_repository(self, repository_path: str, name_mapping: dict | None = None) -> None:
        """Serve the models of another local repository (explicit model control), its folders named in
        `name_mapping` (folder -> model name) under those names."""
        self._call(self._api().register_repository, os.path.abspath(repository_path), dict(name_mapping or {}))

    def unregister_model_repository(self, repository_path: str) -> None:
        self._call(self._api().unregister_repository, os.path.abspath(repository_path))

    # -- options ---------------------------------------------------------------------------
    @staticmethod
    def _translate(options: Options) -> tuple[ServerSettings, ResponseCache | None]:
        for name, kind in _TYPES.items():
            value = getattr(options, name)
            if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
                raise TypeError(f"Options.{name} must be {kind.__name__}, got {type(value).__name__}")
        repos = options.model_repository
        if repos is None or repos == [] or repos == "":
            raise InvalidArgumentError("Options.model_repository: at least one model repository is required")
        if isinstance(repos, str):
            repos = [repos]
        if not isinstance(repos, list) or not all(isinstance(r, str) for r in repos):
            raise TypeError("Options.model_repository must be a str or a list of str")
        for repo in repos:
            if not is_remote(repo) and not os.path.isdir(repo):
                raise InternalError(f"failed to stat file {repo}")
            problem = repository_problem(repo) if is_remote(repo) else ""
            if problem:
                raise InternalError(problem)
        for name in _WITHOUT_COUNTERPART:
            if getattr(options, name) != getattr(_DEFAULTS, name):
                raise UnsupportedError(f"Options.{name} has no counterpart in this server; leave it at its default")
        defaults: dict[str, int] = {}
        for backend, backend_settings in options.backend_configuration.items():
            for key, value in backend_settings.items():
                if key != "default-max-batch-size":
                    raise UnsupportedError(f"Options.backend_configuration[{backend!r}][{key!r}]: only "
                                           "default-max-batch-size is supported by this server")
                defaults[backend] = int(value)
        cache = None
        if options.cache_config:
            local = options.cache_config.get("local")
            if set(options.cache_config) != {"local"} or not isinstance(local, dict) or "size" not in local:
                raise UnsupportedError("Options.cache_config: only {'local': {'size': BYTES}} is supported")
            cache = ResponseCache(int(local["size"]))
        control = {ModelControlMode.NONE: "none", ModelControlMode.POLL: "poll",
                   ModelControlMode.EXPLICIT: "explicit"}[ModelControlMode(options.model_control_mode)]
        settings = ServerSettings(
            [r if is_remote(r) else os.path.abspath(r) for r in repos], auto_complete=not options.strict_model_config,
            default_max_batch_sizes=defaults, backend_directory=os.path.abspath(options.backend_directory),
            log_verbose=options.log_verbose, model_control=control, server_id=options.server_id,
            strict_readiness=options.strict_readiness, exit_on_error=options.exit_on_error,
            exit_timeout=float(options.exit_timeout),
            cpu_metrics=options.cpu_metrics, gpu_metrics=options.gpu_metrics,
            metrics_interval=max(0.1, options.metrics_interval / 1000), load_on_demand=options.load_on_demand,
            max_resident_models=options.max_resident_models,
            max_resident_memory_bytes=options.max_resident_memory_mb << 20,
            load_on_demand_wait=float(options.load_on_demand_timeout), load_threads=options.model_load_thread_count,
            load_retries=options.model_load_retry_count, model_namespacing=options.model_namespacing,
            metrics=_metrics_config(options.metrics_configuration),
            rate_limit=RateLimitMode(options.rate_limiter_mode) == RateLimitMode.EXEC_COUNT,
            rate_limit_resources=[(r.name, r.count, r.device if r.device >= 0 else None)
                                  for r in options.rate_limiter_resources],
            flags=_given_options(options))
        if control == "explicit":  # Triton reads the startup models in explicit model control only
            settings.load_models = list(options.startup_models)
        try:
            settings.check(lambda name: _OPTIONS.get(name, f"Options.{name}"))
        except SettingsError as e:
            raise InvalidArgumentError(str(e)) from None
        return settings, cache


# the Options attribute of each setting that a rule between settings names (ServerSettings.check)
_OPTIONS = {"model_control": "Options.model_control_mode", "load_models": "Options.startup_models",
            "load_threads": "Options.model_load_thread_count", "load_retries": "Options.model_load_retry_count",
            "max_resident_memory_bytes": "Options.max_resident_memory_mb"}


def _metrics_config(groups: dict[str, dict[str, str]]) -> MetricsConfig:
    """Options.metrics_configuration: the settings of group "" (Triton's for those of no group), as
    --metrics-config gives them; InvalidArgumentError for another group or a setting not known."""
    for group in groups:
        if group != "":
            raise InvalidArgumentError(f"Options.metrics_configuration: unknown group '{group}'; the latency "
                                       "settings are in group \"\"")
    try:
        return parse_metrics_config({k: str(v) for k, v in groups.get("", {}).items()})
    except MetricsConfigError as e:
        raise InvalidArgumentError(f"Options.metrics_configuration: {e}") from None


class ModelDictionary(dict):
    """Server.models(): (name, version) -> Model; a bare name gives the model's highest ready version."""

    def __init__(self, server: Server, models: list[Model]):
        super().__init__()
        for model in models:
            self[(model.name, model.version)] = model
        self._server = server
        self._names = {model.name for model in models}

    def __getitem__(self, key):
        if isinstance(key, tuple):
            try:
                return dict.__getitem__(self, key)
            except KeyError:
                raise KeyError(f"Unknown Model: {key}") from None
        if key in self._names:
            return Model(self._server, key, -1)
        raise KeyError(f"Unknown Model: {key}")


@atexit.register
def _stop_live_servers() -> None:
    """A program that ends without stop() still stops its models (and leaves no shared memory)."""
    for server in list(_live_servers):
        server.stop()
