"""The `tritonmp` command's lifecycle: the server's core (server_core.py, shared with the in-process
API), the HTTP, gRPC and metrics frontends on the main loop; stop in order on a signal (stop
accepting, drain in-flight requests, stop workers, unlink shared memory)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
import time
from dataclasses import dataclass

import uvicorn

from .dataplane import EXTENSIONS, Dataplane
from .frontends import grpc_server as grpc_frontend
from .frontends.http2 import Keepalive
from .frontends.http_protocol import Limits, default_max_connections, protocol_class
from .frontends.http_server import HttpApp
from .frontends.restricted import Restrictions
from .observability.log_settings import LogSettings
from .observability.metrics import MetricsApp, SystemSampler
from .observability.sd_notify import Notifier
from .observability.tracing import Tracer
from .repository.model_manager import ModelManager, ServerOptions
from .scheduling.response_cache import ResponseCache
from .server_core import ServerCore

log = logging.getLogger("tritonmp.server")


@dataclass
class Endpoints:
    http_address: str = "0.0.0.0"
    http_port: int = 8000
    allow_http: bool = True
    grpc_address: str = "0.0.0.0"
    grpc_port: int = 8001
    allow_grpc: bool = True
    grpc_tls: dict | None = None  # server_cert, server_key, root_cert, mutual
    metrics_address: str = "0.0.0.0"
    metrics_port: int = 8002
    allow_metrics: bool = True
    allow_cpu_metrics: bool = True
    allow_gpu_metrics: bool = True
    metrics_interval: float = 2.0
    grpc_engine: str = "builtin"  # or "grpcio"
    grpc_keepalive: Keepalive | None = None  # the built-in engine's keepalive and connection age
    grpcio_options: list | None = None  # the same, and Triton's HTTP/2 ping settings, for grpc.aio
    http_restrictions: Restrictions | None = None  # --http-restricted-api
    grpc_restrictions: Restrictions | None = None  # --grpc-restricted-protocol
    http_max_input_size: int = 64 << 20
    http_limits: Limits = Limits()  # header and body deadlines, keep-alive, connections per listener
    grpc_max_input_size: int = 64 << 20


class _Uvicorn(uvicorn.Server):
    """uvicorn without its own signal handling: the server's loop decides when to stop."""

    @contextlib.contextmanager
    def capture_signals(self):
        yield


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


class Server:
    def __init__(self, options: ServerOptions, endpoints: Endpoints, strict_readiness: bool = True,
                 exit_on_error: bool = True, exit_timeout: float = 30.0, allow_client_shm: bool = False,
                 model_control: str = "none", load_models: list[str] | None = None, poll_secs: float = 15.0,
                 log_settings: LogSettings | None = None, tracer: Tracer | None = None,
                 cache: ResponseCache | None = None, server_id: str = "triton"):
        self.options = options
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
        self.http: _Uvicorn | None = None
        self.http_task: asyncio.Task | None = None
        self.metrics: _Uvicorn | None = None
        self.metrics_task: asyncio.Task | None = None
        self.sampler_task: asyncio.Task | None = None
        self.grpc = None

    def _on_signal(self, signum: int) -> None:
        self.signals += 1
        if self.signals > 1:
            log.warning("received %s again: stopping now", signal.Signals(signum).name)
            self.force_stop.set()
            if self.http is not None:
                self.http.force_exit = True
            return
        log.info("received %s, shutting down: finishing requests in flight for up to %.0fs",
                 signal.Signals(signum).name, self.exit_timeout)
        self.stop_requested.set()

    def _serve_asgi(self, app, address: str, port: int, **options) -> tuple[_Uvicorn, asyncio.Task]:
        """An ASGI app on uvicorn in this loop, with the server's HTTP limits. The socket is bound
        here, so the port listens (and a busy port fails) before serving starts."""
        limits = self.endpoints.http_limits
        config = uvicorn.Config(app, loop="none", http=protocol_class(limits), lifespan="off", access_log=False,
                                log_level="warning", timeout_keep_alive=limits.keepalive_timeout, **options)
        sock = socket.create_server((address, port), backlog=4096)
        server = _Uvicorn(config)
        return server, asyncio.get_running_loop().create_task(server.serve(sockets=[sock]))

    async def _start_frontends(self, models: ModelManager, dataplane: Dataplane) -> None:
        ep = self.endpoints
        if ep.allow_http:
            app = HttpApp(dataplane, ep.http_restrictions, ep.http_max_input_size)
            self.http, self.http_task = self._serve_asgi(app, ep.http_address, ep.http_port,
                                                         timeout_graceful_shutdown=self.exit_timeout)
            log.info("Started HTTPService at %s:%d", ep.http_address, ep.http_port)
        if ep.allow_metrics:
            system = SystemSampler(ep.allow_cpu_metrics, ep.allow_gpu_metrics, self.options.gpus)
            self.sampler_task = asyncio.get_running_loop().create_task(system.run(ep.metrics_interval))
            self.metrics, self.metrics_task = self._serve_asgi(MetricsApp(models, system), ep.metrics_address,
                                                               ep.metrics_port)
            log.info("Started Metrics Service at %s:%d", ep.metrics_address, ep.metrics_port)
        if ep.allow_grpc:
            self.grpc = await grpc_frontend.start(dataplane, EXTENSIONS, ep.grpc_address, ep.grpc_port, ep.grpc_tls,
                                                  ep.grpc_engine, ep.grpc_keepalive, ep.grpcio_options,
                                                  ep.grpc_restrictions, ep.grpc_max_input_size,
                                                  ep.http_limits.max_connections or default_max_connections())
            log.info("Started GRPCInferenceService at %s:%d", ep.grpc_address, ep.grpc_port)

    async def _drain_frontends(self, deadline: float) -> bool:
        """Stop accepting and let requests in flight finish until the deadline; False when a second
        signal cut that short."""
        drains = []
        if self.sampler_task is not None:
            self.sampler_task.cancel()
        if self.metrics is not None:
            self.metrics.should_exit = True
            drains.append(self.metrics_task)
        if self.grpc is not None:
            drains.append(self.grpc.stop(max(0.0, deadline - time.monotonic())))
        if self.http is not None:
            self.http.should_exit = True
            drains.append(self.http_task)
        draining = asyncio.gather(*drains, return_exceptions=True)
        forced = asyncio.get_running_loop().create_task(self.force_stop.wait())
        await asyncio.wait({draining, forced}, return_when=asyncio.FIRST_COMPLETED)
        forced.cancel()
        if self.force_stop.is_set() and self.grpc is not None:
            await self.grpc.stop(0)
        return not self.force_stop.is_set()

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._on_signal, sig)
        watchdog = loop.create_task(self.notifier.watchdog())
        core = ServerCore(self.options, model_control=self.model_control, strict_readiness=self.strict_readiness,
                          allow_client_shm=self.allow_client_shm, log_settings=self.log_settings,
                          tracer=self.tracer, cache=self.cache, server_id=self.server_id)
        await core.build()
        models, dataplane = core.models, core.dataplane
        poller = None
        code = 0
        try:
            try:
                await self._start_frontends(models, dataplane)
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
                self.notifier.notify("READY=1", "STATUS=serving" + (f"; {len(failures)} model version(s) "
                                                                    "unavailable" if failures else ""))
                if failures and self.exit_on_error:
                    log.error("failed to load all models:\n  %s", "\n  ".join(failures))
                    code = 1
                    self.stop_requested.set()
                elif self.model_control == "poll":
                    poller = loop.create_task(models.poll(self.poll_secs))
                await stop
            else:
                load.cancel()
        finally:
            dataplane.accepting = False  # readiness drops at once, while the frontends drain
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
