"""The `tritonmp` command's lifecycle: the server's runtime (runtime.py) and the HTTP, gRPC and
metrics services (tritonfrontend's, started through `for_command`), the same as the in-process API
serves, on the main loop; stop in order on a signal (stop accepting, drain in-flight requests, stop
workers, unlink shared memory)."""

from __future__ import annotations

import asyncio
import gc
import signal
import time
from dataclasses import dataclass
from typing import Any

from .lifecycle.model_manager import ModelManager
from .lifecycle.model_version import ServerOptions
from .logs import get_logger
from .observability.log_settings import LogSettings
from .observability.sd_notify import Notifier
from .observability.tracing import Tracer
from .runtime import ServerRuntime
from .scheduling.response_cache import ResponseCache
from .tritonfrontend._frontends import KServeGrpc, KServeHttp, Metrics

log = get_logger("server")


@dataclass
class Endpoints:
    """The network services the command serves, as tritonfrontend's Options (None: turned off)."""

    http: KServeHttp.Options | None = None
    grpc: KServeGrpc.Options | None = None
    metrics: Metrics.Options | None = None
    allow_cpu_metrics: bool = True
    allow_gpu_metrics: bool = True
    metrics_interval: float = 2.0


def _model_table(models: ModelManager) -> str:
    rows = []
    for name in sorted(models.models):
        entry = models.models[name]
        if entry.problem:
            rows.append((name, "-", "UNAVAILABLE: " + entry.problem.splitlines()[0]))
        for v, mv in sorted(entry.versions.items()):
            reason = mv.reason.splitlines()[0] if mv.reason else ""
            status = mv.state if mv.state == "READY" else f"{mv.state}: {reason}"
            rows.append((name, str(v), status))
    header = ("Model", "Version", "Status")
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(3)]
    line = "+" + "+".join("-" * (w + 2) for w in widths) + "+"

    def fmt(r):
        return "|" + "|".join(f" {c:<{w}} " for c, w in zip(r, widths)) + "|"

    return "\n".join([line, fmt(header), line, *(fmt(r) for r in rows), line])


def _settle_collector() -> None:
    """Once the start-up models are loaded: what start-up made (modules, protobuf descriptors, model
    configs, about 50,000 objects the collector tracks) lives as long as the process, so it is taken
    out of the collector's sight. A full collection then walks only what serving has made since:
    on add_py under perf_analyzer gRPC -c64, timed with gc.callbacks, a full collection paused the
    loop, and every request in flight, for 24-34 ms before and 1-1.3 ms after."""
    gc.collect()
    gc.freeze()


class Command:
    def __init__(self, options: ServerOptions, endpoints: Endpoints, strict_readiness: bool = True,
                 exit_on_error: bool = True, exit_timeout: float = 30.0, allow_client_shm: bool = False,
                 model_control: str = "none", load_models: list[str] | None = None, poll_secs: float = 15.0,
                 log_settings: LogSettings | None = None, tracer: Tracer | None = None,
                 cache: ResponseCache | None = None, server_id: str = "triton", flags: dict | None = None):
        self.options = options
        self.flags = flags or {}
        self.server_id = server_id
        self.endpoints = endpoints
        self.strict_readiness = strict_readiness
        self.exit_on_error = exit_on_error
        self.exit_timeout = exit_timeout
        self.allow_client_shm = allow_client_shm
        self.model_control = model_control
        self.load_models = load_models or []
        self.poll_secs = poll_secs
        self.log_settings = log_settings or LogSettings()
        self.tracer = tracer or Tracer()
        self.cache = cache
        self.stop_requested = asyncio.Event()
        self.force_stop = asyncio.Event()
        self.signals = 0
        self.notifier = Notifier()
        self.services: list = []  # tritonfrontend's services, started

    def _on_signal(self, signum: int) -> None:
        self.signals += 1
        if self.signals > 1:
            log.warning("received %s again: stopping now", signal.Signals(signum).name)
            self.force_stop.set()
            return
        log.info("received %s, shutting down: finishing requests in flight for up to %.0fs",
                 signal.Signals(signum).name, self.exit_timeout)
        self.stop_requested.set()

    async def _start_frontends(self, core: ServerRuntime) -> None:
        """HTTP, metrics and gRPC through tritonfrontend's services, the same as an in-process server's."""
        ep = self.endpoints
        core.metrics_settings = (ep.allow_cpu_metrics, ep.allow_gpu_metrics, ep.metrics_interval)
        for cls, options, name in ((KServeHttp, ep.http, "HTTPService"), (Metrics, ep.metrics, "Metrics Service"),
                                   (KServeGrpc, ep.grpc, "GRPCInferenceService")):
            if options is not None:
                service = cls.for_command(options)
                await service.serve(core)
                self.services.append(service)
                log.info("Started %s at %s:%d", name, options.address, options.port)

    async def _drain_frontends(self, deadline: float) -> bool:
        """Stop accepting and let requests in flight finish until the deadline; False when a second
        signal cut that short."""
        running = [(service, service._running) for service in self.services]
        draining = asyncio.gather(*(service.drain(deadline) for service in self.services), return_exceptions=True)
        forced = asyncio.get_running_loop().create_task(self.force_stop.wait())
        either: list[asyncio.Future[Any]] = [draining, forced]
        await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
        if self.force_stop.is_set():
            for service, handle in running:
                if handle is not None:
                    await service.force(handle)
            await draining
        forced.cancel()
        return not self.force_stop.is_set()

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._on_signal, sig)
        watchdog = loop.create_task(self.notifier.watchdog())
        core = ServerRuntime(self.options, model_control=self.model_control, strict_readiness=self.strict_readiness,
                          allow_client_shm=self.allow_client_shm, log_settings=self.log_settings,
                          tracer=self.tracer, cache=self.cache, server_id=self.server_id)
        core.flags = self.flags
        await core.build()
        models, api = core.models, core.api
        assert models is not None and api is not None, "built just above"
        poller = None
        code = 0
        try:
            try:
                await self._start_frontends(core)
            except OSError as e:  # a port in use, an address not on this host, unreadable TLS files
                log.error("cannot serve: %s", e)
                return 1
            names = self.load_models if self.model_control == "explicit" else None
            load = loop.create_task(core.load_startup(names))
            stop = loop.create_task(self.stop_requested.wait())
            await asyncio.wait({load, stop}, return_when=asyncio.FIRST_COMPLETED)
            if load.done():
                failures = load.result()
                log.info("\n%s", _model_table(models))
                _settle_collector()
                self.notifier.notify("READY=1", "STATUS=serving" + (f"; {len(failures)} model version(s) "
                                                                    "unavailable" if failures else ""))
                if failures and self.exit_on_error:
                    log.error("failed to load all models:\n  %s", "\n  ".join(failures))
                    code = 1
                    self.stop_requested.set()
                elif self.model_control == "poll":
                    poller = loop.create_task(models.poll(self.poll_secs, core.fingerprints))
                await stop
            else:
                load.cancel()
        finally:
            api.accepting = False  # readiness drops at once, while the frontends drain
            self.notifier.notify("STOPPING=1", "STATUS=finishing requests in flight")
            if poller is not None:
                poller.cancel()
            deadline = time.monotonic() + self.exit_timeout
            if not await self._drain_frontends(deadline):
                deadline = time.monotonic()  # a second signal: stop workers now, still cleaning up
            await core.shutdown(deadline)
            self.tracer.flush()
            watchdog.cancel()
            self.notifier.close()
            log.info("server stopped")
        return code
