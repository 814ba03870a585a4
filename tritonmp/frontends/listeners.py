"""The server's network listeners: KServe HTTP/REST (:8000), KServe gRPC (:8001) and metrics with the
status page (:8002), each built from its settings and served over the server API on the running
loop. The `tritonmp` command makes them from its flags (cli.py); the in-process API's
`tritonfrontend` services make them from Triton's Options. A listener serves, drains (stops
accepting, lets requests in flight finish by a deadline) and, when told, stops at once."""

from __future__ import annotations

import asyncio
import contextlib
import re
import socket
import time
from dataclasses import dataclass, field

import uvicorn

from ..observability.system import SystemSampler
from ..server_api import EXTENSIONS, ServerApi
from . import grpc_server
from .grpc_compression import COMPRESSION_LEVELS
from .http2 import Keepalive
from .http_protocol import Limits, default_max_connections, protocol_class
from .http_server import DEFAULT_MAX_INPUT_SIZE, HttpApp
from .metrics_app import MetricsApp
from .restricted import Restrictions
from .sagemaker import INFERENCE_TYPES, SagemakerApp
from .vertex_ai import VertexAiApp


def _check_address(port: int) -> None:
    if not 0 <= port <= 65535:
        raise ValueError(f"port must be between 0 and 65535, got {port}")


def _check_max_input_size(size: int) -> None:
    if size <= 0:
        raise ValueError("max_input_size must be greater than 0")


@dataclass
class HttpSettings:
    address: str = "0.0.0.0"
    port: int = 8000
    reuse_port: bool = False
    restrictions: Restrictions | None = None  # --http-restricted-api
    header_forward: re.Pattern | None = None  # --http-header-forward-pattern, compiled
    max_input_size: int = DEFAULT_MAX_INPUT_SIZE  # the largest request body, received and decompressed
    limits: Limits = field(default_factory=Limits)  # connection deadlines and limits
    graceful_timeout: float | None = None  # how long requests in flight may finish (None: as long as they take)

    def __post_init__(self) -> None:
        _check_address(self.port)
        _check_max_input_size(self.max_input_size)


@dataclass
class GrpcSettings:
    address: str = "0.0.0.0"
    port: int = 8001
    tls: dict | None = None  # server_cert, server_key, root_cert, mutual
    keepalive: Keepalive = field(default_factory=Keepalive)
    restrictions: Restrictions | None = None  # --grpc-restricted-protocol
    header_forward: re.Pattern | None = None  # --grpc-header-forward-pattern, compiled
    max_input_size: int = grpc_server.DEFAULT_MAX_INPUT_SIZE  # the largest request message
    max_connections: int = 0  # open connections (0: half the file descriptors allowed)
    engine: str = "builtin"  # "builtin" (this server's HTTP/2) or "grpcio" (grpc.aio)
    grpcio_options: list | None = None  # grpc.aio server options, for the grpcio engine
    response_compression: str = "none"  # --grpc-infer-response-compression-level: none, low, medium or high

    def __post_init__(self) -> None:
        _check_address(self.port)
        _check_max_input_size(self.max_input_size)
        if self.response_compression not in COMPRESSION_LEVELS:
            raise ValueError(f"--grpc-infer-response-compression-level must be one of {', '.join(COMPRESSION_LEVELS)}, "
                             f"got '{self.response_compression}'")
        if self.engine not in ("builtin", "grpcio"):
            raise ValueError(f"engine must be 'builtin' or 'grpcio', got {self.engine!r}")
        if self.tls is not None and not (self.tls.get("server_cert") and self.tls.get("server_key")):
            raise ValueError("TLS needs a server certificate and its key")


@dataclass
class MetricsSettings:
    address: str = "0.0.0.0"
    port: int = 8002
    reuse_port: bool = False
    limits: Limits = field(default_factory=Limits)  # connection deadlines and limits

    def __post_init__(self) -> None:
        _check_address(self.port)


@dataclass
class SagemakerSettings:
    """SageMaker's endpoint: where it listens, the range of ports the other services must keep to
    (--sagemaker-safe-port-range), and what SageMaker's environment says (SAGEMAKER_TRITON_PING_MODE,
    SAGEMAKER_TRITON_DEFAULT_MODEL_NAME, SAGEMAKER_TRITON_INFERENCE_TYPE)."""

    address: str = "0.0.0.0"
    port: int = 8080
    safe_range: tuple[int, int] | None = None
    ping_mode: str = "ready"
    default_model: str = "unspecified_SAGEMAKER_TRITON_DEFAULT_MODEL_NAME"
    inference_type: str = "infer"
    restrictions: Restrictions | None = None  # --http-restricted-api, for the multi-model endpoint's routes
    max_input_size: int = DEFAULT_MAX_INPUT_SIZE
    limits: Limits = field(default_factory=Limits)

    def __post_init__(self) -> None:
        _check_address(self.port)
        _check_max_input_size(self.max_input_size)
        if self.inference_type not in INFERENCE_TYPES:
            raise ValueError(f"SAGEMAKER_TRITON_INFERENCE_TYPE is '{self.inference_type}'; it must be one of: "
                             f"{', '.join(INFERENCE_TYPES)}")

    @classmethod
    def from_environment(cls, environ, **settings) -> SagemakerSettings:
        defaults = cls()
        return cls(ping_mode=environ.get("SAGEMAKER_TRITON_PING_MODE", defaults.ping_mode),
                   default_model=environ.get("SAGEMAKER_TRITON_DEFAULT_MODEL_NAME", defaults.default_model),
                   inference_type=environ.get("SAGEMAKER_TRITON_INFERENCE_TYPE", defaults.inference_type), **settings)


@dataclass
class VertexAiSettings:
    """Vertex AI's endpoint: where it listens, its routes (AIP_PREDICT_ROUTE, AIP_HEALTH_ROUTE) and the
    model its predict route serves (--vertex-ai-default-model; else the one model loaded)."""

    address: str = "0.0.0.0"
    port: int = 8080
    predict_route: str = ""
    health_route: str = ""
    default_model: str = ""
    max_input_size: int = DEFAULT_MAX_INPUT_SIZE
    limits: Limits = field(default_factory=Limits)

    def __post_init__(self) -> None:
        _check_address(self.port)
        _check_max_input_size(self.max_input_size)
        if not self.predict_route:
            raise ValueError("API_PREDICT_ROUTE is not defined for Vertex AI endpoint")
        if not self.health_route:
            raise ValueError("AIP_HEALTH_ROUTE is not defined for Vertex AI endpoint")


def check_ports(services: list[tuple[str, str, int, tuple[int, int] | None]]) -> None:
    """Triton's rule for its services' ports: (name, address, port, the range the others on its address
    must keep to, or None). Two on one address and port, or one outside another's range, is a
    ValueError in Triton's words."""
    for i, (name, address, port, allowed) in enumerate(services):
        for j, (other, other_address, other_port, _) in enumerate(services):
            if j == i or other_address != address or (allowed is None and j < i):
                continue
            if allowed is not None and not allowed[0] <= other_port <= allowed[1]:
                raise ValueError(f"The server cannot listen to {other} requests at port {other_port}, allowed port "
                                 f"range is [{allowed[0]}, {allowed[1]}]")
            if port == other_port != 0:  # port 0: any free port, which two services never share
                raise ValueError(f"The server cannot listen to {name} requests and {other} requests at the same "
                                 f"address and port {address}:{port}")


class Listener:
    """One listening service over the server API. `serve` and `drain` run on the server's loop."""

    name = ""  # as the log names it when it starts

    def __init__(self, settings) -> None:
        self.settings = settings
        self._running = None  # what _start made, while serving
        self._draining = None  # the same, while it drains

    @property
    def serving(self) -> bool:
        return self._running is not None

    async def serve(self, api: ServerApi) -> None:
        """Listen and serve (OSError when the address cannot be had)."""
        self._running = await self._start(api)

    async def drain(self, deadline: float) -> None:
        """Stop accepting; requests in flight may finish until `deadline` (time.monotonic())."""
        running, self._running = self._running, None
        if running is None:
            return
        self._draining = running
        try:
            await self._stop(running, deadline)
        finally:
            self._draining = None

    async def force(self) -> None:
        """Cut a drain short: what is still open closes now."""
        if self._draining is not None:
            await self._force(self._draining)

    async def _start(self, api: ServerApi):
        raise NotImplementedError

    def loaded(self, api: ServerApi) -> None:
        """The startup load has ended: a listener whose settings depend on the models loaded checks
        them now (ValueError: the server cannot serve as told)."""

    async def _stop(self, running, deadline: float) -> None:
        raise NotImplementedError

    async def _force(self, running) -> None:
        raise NotImplementedError

    def _socket(self, reuse_port: bool) -> socket.socket:
        s = self.settings
        sock = socket.socket(socket.AF_INET6 if ":" in s.address else socket.AF_INET)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((s.address, s.port))
        sock.listen(4096)
        return sock


class _AsgiListener(Listener):
    """A listener whose connections uvicorn runs with this server's guarded HTTP/1.1 protocol."""

    def _serve_asgi(self, app, limits: Limits, reuse_port: bool, graceful_timeout: float | None = None,
                    max_body: int = 0, fast_infer=None, forward=None) -> tuple[uvicorn.Server, asyncio.Task]:
        config = uvicorn.Config(app, loop="none", http=protocol_class(limits, max_body, fast_infer, forward),
                                lifespan="off",
                                access_log=False, server_header=False,  # Triton sends no Server header either
                                log_level="warning",
                                # seconds, which uvicorn annotates as int and uses as float
                                timeout_keep_alive=limits.keepalive_timeout,  # type: ignore[arg-type]
                                timeout_graceful_shutdown=graceful_timeout)  # type: ignore[arg-type]
        server = _Uvicorn(config)
        sock = self._socket(reuse_port)
        return server, asyncio.get_running_loop().create_task(server.serve(sockets=[sock]))

    async def _stop(self, running, deadline: float) -> None:
        server, task = running[:2]
        server.should_exit = True
        await task

    async def _force(self, running) -> None:
        running[0].force_exit = True


class _Uvicorn(uvicorn.Server):
    """uvicorn without signal handling of its own: the program's signals stay the program's."""

    def install_signal_handlers(self) -> None:
        pass

    @contextlib.contextmanager
    def capture_signals(self):
        yield


class HttpListener(_AsgiListener):
    name = "HTTPService"

    def __init__(self, settings: HttpSettings):
        super().__init__(settings)

    async def _start(self, api: ServerApi):
        s = self.settings
        app = HttpApp(api, s.restrictions, s.max_input_size)
        return self._serve_asgi(app, s.limits, s.reuse_port, s.graceful_timeout, max_body=s.max_input_size,
                                fast_infer=app.fast_infer, forward=s.header_forward)


class SagemakerListener(_AsgiListener):
    name = "Sagemaker HTTPService"

    def __init__(self, settings: SagemakerSettings):
        super().__init__(settings)

    async def _start(self, api: ServerApi):
        s = self.settings
        app = SagemakerApp(api, HttpApp(api, s.restrictions, s.max_input_size), s.ping_mode, s.default_model,
                           s.inference_type)
        return self._serve_asgi(app, s.limits, False, max_body=s.max_input_size)


class VertexAiListener(_AsgiListener):
    """Vertex AI's endpoint; its default model is settled when the startup load has ended, as Triton
    settles it when it starts the endpoint."""

    name = "Vertex AI HTTPService"

    def __init__(self, settings: VertexAiSettings):
        super().__init__(settings)
        self.app: VertexAiApp | None = None

    async def _start(self, api: ServerApi):
        s, server_settings = self.settings, api.settings
        system = SystemSampler(server_settings.cpu_metrics, server_settings.gpu_metrics, server_settings.gpus)
        sampler = asyncio.get_running_loop().create_task(system.run(server_settings.metrics_interval))
        self.app = VertexAiApp(api, HttpApp(api, None, s.max_input_size), system, s.predict_route, s.health_route)
        server, task = self._serve_asgi(self.app, s.limits, False, max_body=s.max_input_size)
        return server, task, sampler

    async def _stop(self, running, deadline: float) -> None:
        running[2].cancel()
        await super()._stop(running, deadline)

    def loaded(self, api: ServerApi) -> None:
        ready = api.ready_model_names()
        name = self.settings.default_model
        if not name:
            if len(ready) != 1:
                raise ValueError("Expect the model repository contains only a single model if default model is "
                                 "not specified")
            name = ready[0]
        elif name not in ready:
            raise ValueError(f"Expect the default model '{name}' is loaded")
        if self.app is not None:
            self.app.default_model = name


class GrpcListener(Listener):
    name = "GRPCInferenceService"

    def __init__(self, settings: GrpcSettings):
        super().__init__(settings)

    async def _start(self, api: ServerApi):
        s = self.settings
        return await grpc_server.start(api, EXTENSIONS, s.address, s.port, s.tls, s.engine, s.keepalive,
                                       s.grpcio_options, s.restrictions, s.max_input_size,
                                       s.max_connections or default_max_connections(), s.header_forward,
                                       s.response_compression)

    async def _stop(self, running, deadline: float) -> None:
        await running.stop(max(0.0, deadline - time.monotonic()))

    async def _force(self, running) -> None:
        await running.stop(0)


class MetricsListener(_AsgiListener):
    """Prometheus metrics and the status page; the CPU and GPU figures are sampled as the server's
    settings say (cpu_metrics, gpu_metrics, metrics_interval) while it serves."""

    name = "Metrics Service"

    def __init__(self, settings: MetricsSettings):
        super().__init__(settings)

    async def _start(self, api: ServerApi):
        s, server_settings = self.settings, api.settings
        system = SystemSampler(server_settings.cpu_metrics, server_settings.gpu_metrics, server_settings.gpus)
        history = api.status_history()
        loop = asyncio.get_running_loop()
        samplers = (loop.create_task(system.run(server_settings.metrics_interval)), loop.create_task(history.run()))
        server, task = self._serve_asgi(MetricsApp(api, system, history), s.limits, s.reuse_port)
        return server, task, samplers

    async def _stop(self, running, deadline: float) -> None:
        for sampler in running[2]:
            sampler.cancel()
        await super()._stop(running, deadline)
