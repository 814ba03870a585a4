"""Triton's tritonfrontend API over an in-process server: `KServeHttp`, `KServeGrpc` and `Metrics`
take Triton's Options, check them as Triton does, and serve through the server's own listeners
(frontends/listeners.py), the same the `tritonmp` command serves.

Their Options are Triton's, plus a few of this server's own with defaults (HTTP limits, input
size limits, the gRPC engine)."""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field
from typing import Any

from ..frontends import grpc_server
from ..frontends.header_forwarding import compile_pattern
from ..frontends.http2 import Keepalive
from ..frontends.http_protocol import Limits
from ..frontends.http_server import DEFAULT_MAX_INPUT_SIZE
from ..frontends.listeners import (
    GrpcListener,
    GrpcSettings,
    HttpListener,
    HttpSettings,
    Listener,
    MetricsListener,
    MetricsSettings,
)
from ..frontends.restricted import GRPC_HEADER_PREFIX, Restrictions
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


class _Service:
    """A network service of an in-process server: `start`, `stop` and use as a context manager,
    from the caller's thread; the listener runs on the server's loop."""

    Options: type  # each service's own Options dataclass

    def __init__(self, server: Server, options: Any):
        if not isinstance(server, Server):
            raise InvalidArgumentError("server must be a tritonserver.Server")
        if not isinstance(options, self.Options):
            raise InvalidArgumentError(f"Incorrect type for options. options argument must be of type "
                                       f"{type(self).__name__}.Options")
        self.server = server
        self.options: Any = options  # the service's own Options
        try:
            self._listener = self._listener_for(options)
        except ValueError as e:
            raise InvalidArgumentError(str(e)) from None

    @staticmethod
    def _listener_for(options) -> Listener:
        raise NotImplementedError

    def _engine(self):
        if self.server._engine is None:
            raise UnavailableError("the server is not started")
        return self.server._engine

    def start(self) -> None:
        if self._listener.serving:
            raise InvalidArgumentError(f"{type(self).__name__} is already started")
        engine = self._engine()
        try:
            engine.call(self._listener.serve(engine.api))
        except OSError as e:  # a port in use, an address not on this host
            raise UnavailableError(f"{type(self).__name__} cannot listen on {self.options.address}:"
                                   f"{self.options.port}: {e}") from None

    def stop(self) -> None:
        if self._listener.serving and self.server._engine is not None:
            self.server._engine.call(self._listener.drain(time.monotonic()))

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def _thread_count(options) -> None:
    if options.thread_count <= 0:
        raise ValueError("thread_count must be greater than 0")


class KServeHttp(_Service):
    @dataclass
    class Options:
        address: str = "0.0.0.0"
        port: int = 8000
        reuse_port: bool = False
        thread_count: int = 8  # requests are served on one asyncio loop; kept for Triton's signature
        header_forward_pattern: str = ""
        restricted_features: RestrictedFeatures = field(default_factory=RestrictedFeatures)
        # this server's own: the largest request body, connection deadlines and limits, and how long
        # requests in flight may finish once the service stops (None: as long as they take)
        max_input_size: int = DEFAULT_MAX_INPUT_SIZE
        limits: Limits = field(default_factory=Limits)
        graceful_timeout: float | None = None

    def __init__(self, server: Server, options: KServeHttp.Options | None = None):
        super().__init__(server, options or KServeHttp.Options())

    @staticmethod
    def _listener_for(options) -> Listener:
        _thread_count(options)
        return HttpListener(HttpSettings(
            options.address, options.port, options.reuse_port,
            options.restricted_features._restrictions("restricted_features"),
            compile_pattern(options.header_forward_pattern, "header_forward_pattern"),
            options.max_input_size, options.limits, options.graceful_timeout))


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
        restricted_features: RestrictedFeatures = field(default_factory=RestrictedFeatures)
        # this server's own: the largest request message, open connections (0: half the file
        # descriptors allowed), how long a new connection has for HTTP/2's preface (and a frame other
        # than DATA, once begun, to be complete), how long a DATA frame has, and the engine
        # ("builtin", or "grpcio" with grpc.aio server options)
        max_input_size: int = grpc_server.DEFAULT_MAX_INPUT_SIZE
        max_connections: int = 0
        preface_timeout_s: float = 10.0
        data_timeout_s: float = 60.0
        engine: str = "builtin"
        grpcio_options: list | None = None

    def __init__(self, server: Server, options: KServeGrpc.Options | None = None):
        super().__init__(server, options or KServeGrpc.Options())

    @staticmethod
    def _listener_for(options) -> Listener:
        o = options
        if o.reuse_port:
            raise UnsupportedError("reuse_port: the gRPC service binds its port alone in this server")
        if int(o.infer_compression_level) != 0:
            raise UnsupportedError("infer_compression_level: responses are not compressed by this server")
        if o.use_ssl and not (o.server_cert and o.server_key):
            raise ValueError("use_ssl needs server_cert and server_key")
        tls = None
        if o.use_ssl:
            tls = {"server_cert": o.server_cert, "server_key": o.server_key, "root_cert": o.root_cert,
                   "mutual": o.use_mutual_auth}
        keepalive = Keepalive.from_triton_ms(
            o.keepalive_time_ms, o.keepalive_timeout_ms, o.keepalive_permit_without_calls, o.max_connection_age_ms,
            o.max_connection_age_grace_ms, o.http2_min_recv_ping_interval_without_data_ms, o.http2_max_ping_strikes,
            preface_timeout=o.preface_timeout_s, data_timeout=o.data_timeout_s)
        return GrpcListener(GrpcSettings(
            o.address, o.port, tls, keepalive, o.restricted_features._restrictions("restricted_features",
                                                                                   GRPC_HEADER_PREFIX),
            compile_pattern(o.forward_header_pattern, "forward_header_pattern"), o.max_input_size,
            o.max_connections, o.engine, o.grpcio_options))


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
    def _listener_for(options) -> Listener:
        _thread_count(options)
        return MetricsListener(MetricsSettings(options.address, options.port, options.reuse_port, options.limits))

    def start(self) -> None:
        if not self.server.options.metrics:
            raise UnavailableError("metrics are turned off in the server's Options (metrics=False)")
        super().start()
