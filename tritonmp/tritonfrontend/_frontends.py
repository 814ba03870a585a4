"""The network services: KServe HTTP/REST, KServe gRPC, and metrics, over an in-process server
(Triton's tritonfrontend API) and, through the same classes, for the `tritonmp` command
(tritonmp/server.py), which serves them on its own event loop (`for_command`, `serve`, `drain`).

Their Options are Triton's, plus a few of this server's own with defaults (HTTP limits, input
size limits, the gRPC engine), which the command sets from its flags."""

from __future__ import annotations

import asyncio
import contextlib
import enum
import socket
import time
from dataclasses import dataclass, field

import uvicorn

from ..frontends import grpc_server
from ..frontends.header_forwarding import compile_pattern
from ..frontends.http2 import Keepalive
from ..frontends.http_protocol import Limits, default_max_connections, protocol_class
from ..frontends.http_server import DEFAULT_MAX_INPUT_SIZE, HttpApp
from ..frontends.restricted import GRPC_HEADER_PREFIX, Restrictions
from ..observability.metrics import MetricsApp, SystemSampler
from ..observability.status import StatusHistory
from ..runtime import ServerRuntime
from ..server_api import EXTENSIONS
from ..tritonserver import InvalidArgumentError, Server, UnavailableError, UnsupportedError


class RestrictedFeatures:
    """Which API groups (health, metadata, inference, shared-memory, model-config, model-repository,
    statistics, trace, logging) need which header and value, as Triton's restricted-API flags."""

    def __init__(self, groups: list[dict] | None = None):
        self.rules: list[tuple[list[str], str, str]] = []
        for group in groups or []:
            self.create_feature_group(group["key"], group["value"], group["features"])

    def create_feature_group(self, key: str, value: str, features: list[str]) -> None:
        self.rules.append(([str(f) for f in features], key, value))

    def _restrictions(self, flag: str, header_prefix: str = "") -> Restrictions | None:
        if not self.rules:
            return None
        items = [f"{','.join(features)}:{key}={value}" for features, key, value in self.rules]
        try:
            return Restrictions(items, flag, header_prefix)
        except ValueError as e:
            raise InvalidArgumentError(str(e)) from None


def _restrictions(features, flag: str, header_prefix: str = "") -> Restrictions | None:
    """RestrictedFeatures as the frontends take them (the command passes its flags' Restrictions)."""
    if isinstance(features, Restrictions):
        return features
    return features._restrictions(flag, header_prefix)


class _Service:
    """A network service over the server's core: `serve` and `drain` on the core's loop; `start`,
    `stop` and use as a context manager from the in-process server's caller."""

    def __init__(self, server: Server, options):
        if not isinstance(server, Server):
            raise InvalidArgumentError("server must be a tritonserver.Server")
        if not isinstance(options, self.Options):
            raise InvalidArgumentError(f"Incorrect type for options. options argument must be of type "
                                       f"{type(self).__name__}.Options")
        self._check(options)
        self.server = server
        self.options = options
        self._running = None

    @classmethod
    def for_command(cls, options):
        """The service for the `tritonmp` command, which serves it on its own loop."""
        service = cls.__new__(cls)
        cls._check(options)
        service.server, service.options, service._running = None, options, None
        return service

    def _engine(self):
        if self.server._engine is None:
            raise UnavailableError("the server is not started")
        return self.server._engine

    def start(self) -> None:
        if self._running is not None:
            raise InvalidArgumentError(f"{type(self).__name__} is already started")
        engine = self._engine()
        try:
            engine.call(self.serve(engine))
        except OSError as e:  # a port in use, an address not on this host
            raise UnavailableError(f"{type(self).__name__} cannot listen on {self.options.address}:"
                                   f"{self.options.port}: {e}") from None

    def stop(self) -> None:
        if self._running is not None and self.server._engine is not None:
            self.server._engine.call(self.drain(time.monotonic()))

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    async def serve(self, core: ServerRuntime) -> None:
        """Listen and serve, on the running loop (OSError when the port cannot be had)."""
        self._running = await self._start(core)

    async def drain(self, deadline: float) -> None:
        """Stop accepting; requests in flight may finish until `deadline` (time.monotonic())."""
        running, self._running = self._running, None
        if running is not None:
            await self._stop(running, deadline)

    async def force(self, running) -> None:
        """Cut a drain short: what is still open closes now."""

    def _socket(self) -> socket.socket:
        sock = socket.socket(socket.AF_INET6 if ":" in self.options.address else socket.AF_INET)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if self.options.reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((self.options.address, self.options.port))
        sock.listen(4096)
        return sock

    def _serve_asgi(self, app, limits: Limits, graceful_timeout: float | None = None, max_body: int = 0,
                    fast_app=None, forward=None) -> tuple[uvicorn.Server, asyncio.Task]:
        config = uvicorn.Config(app, loop="none", http=protocol_class(limits, max_body, fast_app, forward),
                                lifespan="off",
                                access_log=False, server_header=False,  # Triton sends no Server header either
                                log_level="warning", timeout_keep_alive=limits.keepalive_timeout,
                                timeout_graceful_shutdown=graceful_timeout)
        server = _Uvicorn(config)
        return server, asyncio.get_running_loop().create_task(server.serve(sockets=[self._socket()]))

    @staticmethod
    async def _stop_asgi(running, deadline: float) -> None:
        server, task = running[:2]
        server.should_exit = True
        await task

    @staticmethod
    def _check(options) -> None:
        if not 0 <= options.port <= 65535:
            raise InvalidArgumentError(f"port must be between 0 and 65535, got {options.port}")


class _Uvicorn(uvicorn.Server):
    """uvicorn without signal handling of its own: the program's signals stay the program's."""

    def install_signal_handlers(self) -> None:
        pass

    @contextlib.contextmanager
    def capture_signals(self):
        yield


class KServeHttp(_Service):
    @dataclass
    class Options:
        address: str = "0.0.0.0"
        port: int = 8000
        reuse_port: bool = False
        thread_count: int = 8  # requests are served on one asyncio loop; kept for Triton's signature
        header_forward_pattern: str = ""
        restricted_features: RestrictedFeatures | Restrictions = field(default_factory=RestrictedFeatures)
        # this server's own: the largest request body, connection deadlines and limits, and how long
        # requests in flight may finish once the service stops (None: as long as they take)
        max_input_size: int = DEFAULT_MAX_INPUT_SIZE
        limits: Limits = field(default_factory=Limits)
        graceful_timeout: float | None = None

    def __init__(self, server: Server, options: KServeHttp.Options | None = None):
        super().__init__(server, options or KServeHttp.Options())

    @staticmethod
    def _check(options) -> None:
        _Service._check(options)
        if options.thread_count <= 0:
            raise InvalidArgumentError("thread_count must be greater than 0")
        try:
            compile_pattern(options.header_forward_pattern, "header_forward_pattern")
        except ValueError as e:
            raise InvalidArgumentError(str(e)) from None
        if options.max_input_size <= 0:
            raise InvalidArgumentError("max_input_size must be greater than 0")

    async def _start(self, core: ServerRuntime):
        o = self.options
        restrictions = _restrictions(o.restricted_features, "restricted_features")
        app = HttpApp(core.api, restrictions, o.max_input_size)
        return self._serve_asgi(app, o.limits, o.graceful_timeout, max_body=o.max_input_size, fast_app=app,
                                forward=compile_pattern(o.header_forward_pattern, "header_forward_pattern"))

    _stop = staticmethod(_Service._stop_asgi)

    async def force(self, running) -> None:
        running[0].force_exit = True


class KServeGrpc(_Service):
    class Grpc_compression_level(enum.IntEnum):  # noqa: N801 - Triton's name
        NONE = 0
        LOW = 1
        MED = 2
        HIGH = 3
        COUNT = 4

    @dataclass
    class Options:
        address: str = "0.0.0.0"
        port: int = 8001
        reuse_port: bool = False
        use_ssl: bool = False
        server_cert: str = ""
        server_key: str = ""
        root_cert: str = ""
        use_mutual_auth: bool = False
        keepalive_time_ms: int = 7_200_000
        keepalive_timeout_ms: int = 20_000
        keepalive_permit_without_calls: bool = False
        http2_max_pings_without_data: int = 2
        http2_min_recv_ping_interval_without_data_ms: int = 300_000
        http2_max_ping_strikes: int = 2
        max_connection_age_ms: int = 0
        max_connection_age_grace_ms: int = 0
        infer_compression_level: int = 0
        infer_allocation_pool_size: int = 8
        forward_header_pattern: str = ""
        restricted_features: RestrictedFeatures | Restrictions = field(default_factory=RestrictedFeatures)
        # this server's own: the largest request message, open connections (0: half the file
        # descriptors allowed), how long a new connection has for HTTP/2's preface, and the engine
        # ("builtin", or "grpcio" with grpc.aio server options)
        max_input_size: int = grpc_server.DEFAULT_MAX_INPUT_SIZE
        max_connections: int = 0
        preface_timeout_s: float = 10.0
        engine: str = "builtin"
        grpcio_options: list | None = None

    def __init__(self, server: Server, options: KServeGrpc.Options | None = None):
        super().__init__(server, options or KServeGrpc.Options())

    @staticmethod
    def _check(options) -> None:
        _Service._check(options)
        if options.reuse_port:
            raise UnsupportedError("reuse_port: the gRPC service binds its port alone in this server")
        try:
            compile_pattern(options.forward_header_pattern, "forward_header_pattern")
        except ValueError as e:
            raise InvalidArgumentError(str(e)) from None
        if int(options.infer_compression_level) != 0:
            raise UnsupportedError("infer_compression_level: responses are not compressed by this server")
        if options.use_ssl and not (options.server_cert and options.server_key):
            raise InvalidArgumentError("use_ssl needs server_cert and server_key")
        if options.engine not in ("builtin", "grpcio"):
            raise InvalidArgumentError(f"engine must be 'builtin' or 'grpcio', got {options.engine!r}")
        if options.max_input_size <= 0:
            raise InvalidArgumentError("max_input_size must be greater than 0")

    async def _start(self, core: ServerRuntime):
        o = self.options
        tls = None
        if o.use_ssl:
            tls = {"server_cert": o.server_cert, "server_key": o.server_key, "root_cert": o.root_cert,
                   "mutual": o.use_mutual_auth}
        keepalive = Keepalive(time=o.keepalive_time_ms / 1000, timeout=o.keepalive_timeout_ms / 1000,
                              without_calls=o.keepalive_permit_without_calls, max_age=o.max_connection_age_ms / 1000,
                              max_age_grace=o.max_connection_age_grace_ms / 1000,
                              preface_timeout=o.preface_timeout_s,
                              min_ping_interval=o.http2_min_recv_ping_interval_without_data_ms / 1000,
                              max_ping_strikes=o.http2_max_ping_strikes)
        restrictions = _restrictions(o.restricted_features, "restricted_features", GRPC_HEADER_PREFIX)
        return await grpc_server.start(core.api, EXTENSIONS, o.address, o.port, tls, o.engine, keepalive,
                                       o.grpcio_options, restrictions, o.max_input_size,
                                       o.max_connections or default_max_connections(),
                                       compile_pattern(o.forward_header_pattern, "forward_header_pattern"))

    @staticmethod
    async def _stop(running, deadline: float) -> None:
        await running.stop(max(0.0, deadline - time.monotonic()))

    async def force(self, running) -> None:
        await running.stop(0)


class Metrics(_Service):
    @dataclass
    class Options:
        address: str = "0.0.0.0"
        port: int = 8002
        thread_count: int = 1
        reuse_port: bool = False
        limits: Limits = field(default_factory=Limits)  # this server's own: connection deadlines and limits

    def __init__(self, server: Server, options: Metrics.Options | None = None):
        super().__init__(server, options or Metrics.Options())

    @staticmethod
    def _check(options) -> None:
        _Service._check(options)
        if options.thread_count <= 0:
            raise InvalidArgumentError("thread_count must be greater than 0")

    async def _start(self, core: ServerRuntime):
        if self.server is not None and not self.server.options.metrics:
            raise UnavailableError("metrics are turned off in the server's Options (metrics=False)")
        cpu, gpu, interval = core.metrics_settings
        system = SystemSampler(cpu, gpu, core.options.gpus)
        history = StatusHistory(core.models)
        loop = asyncio.get_running_loop()
        samplers = (loop.create_task(system.run(interval)), loop.create_task(history.run()))
        server, task = self._serve_asgi(MetricsApp(core, system, history), self.options.limits)
        return server, task, samplers

    @staticmethod
    async def _stop(running, deadline: float) -> None:
        for sampler in running[2]:
            sampler.cancel()
        await _Service._stop_asgi(running, deadline)
