"""The server's settings: one object, made once from the `tritonmp` command's flags (cli.py) or
from the in-process API's Options (tritonserver/_api/_server.py), and read by every part that the server
builds from it (the runtime, the server API, the model manager, each model version). Plain values
only; the objects the server is given (log settings, tracer, response cache) travel beside it.

The defaults and the rules between settings are stated here once (`check`); the command line and
the in-process Options only map their names onto these fields and say the rules' words in their
own names."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from .metrics_config import MetricsConfig

DEFAULT_BUSY_POLL_US = 500  # --busy-poll-us


@dataclass
class ServerSettings:
    repositories: list[str]
    # -- models and their workers ----------------------------------------------------------
    workers: str = "auto"  # instances of a model without instance_group: "auto" or a count
    auto_complete: bool = True
    # --backend-config default-max-batch-size: backend ("" for all) -> max_batch_size of auto-complete
    default_max_batch_sizes: dict[str, int] = field(default_factory=dict)
    config_name: str = ""  # --model-config-name: read configs/NAME.pbtxt where a model has one
    gpus: list[int] = field(default_factory=list)  # the GPUs this server may use
    # --host-policy: policy name -> its settings (numa-node, cpu-cores), where instances' workers run
    host_policies: dict[str, dict[str, str]] = field(default_factory=dict)
    arena_bytes: int = 64 << 20  # each worker's input and output arena
    log_verbose: int = 0
    execution_timeout: float = 0.0  # a batch that runs longer kills its worker (0: no limit)
    load_timeout: float = 600.0  # a model not loaded after this long fails its load (0: no limit)
    load_threads: int = 4  # --model-load-thread-count: models loading at once (an ensemble's own step waits for none)
    load_retries: int = 0  # --model-load-retry-count: a failed load is tried again this many times
    model_namespacing: bool = False  # --model-namespacing: each repository's models are a namespace of their own
    metrics: MetricsConfig = MetricsConfig()  # --metrics-config: which latency metrics are exported
    rate_limit: bool = False  # --rate-limit=execution_count: instances run batches as the rate limiter grants
    # --rate-limit-resource NAME:COUNT[:DEVICE]: the server's resources (device None: on every device)
    rate_limit_resources: list[tuple[str, int, int | None]] = field(default_factory=list)
    busy_poll_us: int = DEFAULT_BUSY_POLL_US  # the loop polls this long after a batch
    heap_retain_bytes: int = 1 << 30  # --worker-heap-retain-mb: freed memory a worker keeps for reuse
    worker_start: str = "fork"  # --worker-start: "fork" from a template per backend, or "exec" each
    backend_directory: str = ""  # --backend-directory: where python-based backends are ("": none)
    python_env_cache: str = ""  # --python-env-cache: where models' environment archives are unpacked ("": default)
    python_env_from_requirements: bool = False  # --python-env-from-requirements: build one from requirements.txt
    load_on_demand: bool = False  # --load-on-demand: a model loads when first asked for (lifecycle/residency.py)
    max_resident_models: int = 0  # --max-resident-models: with it, the least recently used unload past this (0: any)
    max_resident_memory_bytes: int = 0  # --max-resident-memory-mb: the same for their workers' PSS (0: any)
    load_on_demand_wait: float = 60.0  # --load-on-demand-timeout-secs: how long a request waits for a load
    # -- which models are served, and when ----------------------------------------------------
    model_control: str = "none"  # "none", "poll" or "explicit"
    load_models: list[str] = field(default_factory=list)  # explicit: the models loaded at startup
    poll_secs: float = 15.0  # poll: seconds between looks at the repositories
    # -- the server as its clients see it -----------------------------------------------------
    server_id: str = "triton"  # --id: the name in the server's metadata
    strict_readiness: bool = True  # server readiness asks every model's readiness too
    allow_client_shm: bool = False  # clients may register system shared-memory regions
    exit_on_error: bool = True  # the command exits when a model fails to load at startup
    exit_timeout: float = 30.0  # seconds requests in flight may finish once stopping
    # -- metrics ------------------------------------------------------------------------------
    cpu_metrics: bool = True
    gpu_metrics: bool = True
    metrics_interval: float = 2.0  # seconds between samples of the CPU and GPU figures
    # the settings it was started with that differ from their defaults, as the status page shows them
    flags: dict[str, object] = field(default_factory=dict)

    def check(self, name: Callable[[str], str] = lambda field: field) -> None:
        """Refuse settings that contradict each other, with SettingsError; `name` says a field as the
        caller's users know it (a flag, an Options attribute)."""
        if self.load_models and self.model_control != "explicit":
            raise SettingsError(f"{name('load_models')} needs {name('model_control')} explicit")
        if "*" in self.load_models and len(self.load_models) > 1:  # Triton's words
            raise SettingsError("Wildcard model name '*' must be the ONLY startup model if specified at all.")
        if self.load_on_demand and self.model_control == "poll":
            raise SettingsError(f"{name('load_on_demand')} works with {name('model_control')} none or explicit: "
                                "polling would load every model it finds changed")
        if self.load_threads < 1:
            raise SettingsError(f"{name('load_threads')} must be at least 1")
        if self.load_retries < 0:
            raise SettingsError(f"{name('load_retries')} must not be negative")
        if (self.max_resident_models or self.max_resident_memory_bytes) and not self.load_on_demand:
            raise SettingsError(f"{name('max_resident_models')} and {name('max_resident_memory_bytes')} need "
                                f"{name('load_on_demand')}")


class SettingsError(ValueError):
    """Settings that contradict each other."""


DEFAULTS = ServerSettings(repositories=[])  # every default, for the command line's flags
