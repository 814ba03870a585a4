"""Command line: `tritonmp [serve] --model-repository DIR ...` with Triton's flag names and
defaults, and `tritonmp check REPO...` to validate repositories without serving."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Mapping

from . import __version__, triton_flags
from .frontends.header_forwarding import compile_pattern
from .frontends.http_protocol import Limits
from .frontends.restricted import GRPC_HEADER_PREFIX, Restrictions
from .host_policy import parse as parse_host_policies
from .logs import get_logger
from .metrics_config import parse_metrics_config
from .settings import DEFAULTS, ServerSettings, SettingsError
from .storage.locations import is_remote
from .storage.remote import repository_problem

_bool = triton_flags.parse_bool


# the flag of each setting that a rule between settings names (ServerSettings.check)
FLAGS = {"load_models": "--load-model", "model_control": "--model-control-mode", "load_on_demand": "--load-on-demand",
         "load_threads": "--model-load-thread-count", "load_retries": "--model-load-retry-count",
         "max_resident_models": "--max-resident-models", "max_resident_memory_bytes": "--max-resident-memory-mb"}


def _workers(text: str) -> str:
    if text == "auto" or (text.isdigit() and int(text) > 0):
        return text
    raise argparse.ArgumentTypeError(f"expected 'auto' or a positive count, got '{text}'")


def _count(text: str) -> int:
    if text.isdigit():
        return int(text)
    raise argparse.ArgumentTypeError(f"expected 0 or a positive number, got '{text}'")


def _retain_mib(text: str) -> int:
    """--worker-heap-retain-mb: glibc takes the trim threshold as a C int, so 2047 MiB at most."""
    value = _count(text)
    if value > 2047:
        raise argparse.ArgumentTypeError(f"expected 0 to 2047 (MiB), got '{text}'")
    return value


def serve_parser(environ: Mapping[str, str] = os.environ) -> argparse.ArgumentParser:
    """The command line; on Vertex AI (AIP_MODE=PREDICTION) the defaults are Triton's there: its
    endpoint on, HTTP and gRPC off, the model repository AIP_STORAGE_URI."""
    p = argparse.ArgumentParser(prog="tritonmp", description="A Triton-compatible inference server.")
    p.add_argument("--version", action="version", version=f"tritonmp {__version__}")
    storage_uri = environ.get("AIP_STORAGE_URI", "")
    p.add_argument("--model-repository", "--model-store", action="append", required=not storage_uri, metavar="DIR",
                   help="a model repository (a directory, or s3://, gs://, as:// storage); may be given several "
                        "times" + (f" (default on Vertex AI: AIP_STORAGE_URI, {storage_uri})" if storage_uri else ""))
    p.add_argument("--http-port", type=triton_flags.parse_int, default=8000)
    p.add_argument("--grpc-port", type=triton_flags.parse_int, default=8001)
    p.add_argument("--metrics-port", type=triton_flags.parse_int, default=8002)
    p.add_argument("--http-address", default="0.0.0.0")
    p.add_argument("--grpc-address", default="0.0.0.0")
    p.add_argument("--metrics-address", default="0.0.0.0")
    vertex_ai = environ.get("AIP_MODE", "") == "PREDICTION"
    p.add_argument("--allow-http", type=_bool, default=not vertex_ai)
    p.add_argument("--allow-grpc", type=_bool, default=not vertex_ai)
    p.add_argument("--allow-vertex-ai", type=_bool, default=vertex_ai,
                   help="serve Vertex AI's endpoint (AIP_PREDICT_ROUTE, AIP_HEALTH_ROUTE); on when AIP_MODE=PREDICTION")
    p.add_argument("--vertex-ai-port", type=triton_flags.parse_int,
                   default=triton_flags.parse_int(environ.get("AIP_HTTP_PORT", "8080")))
    p.add_argument("--vertex-ai-default-model", default="", metavar="MODEL",
                   help="the model Vertex AI's predict route serves (default: the one model loaded)")
    p.add_argument("--allow-metrics", type=_bool, default=True)
    p.add_argument("--allow-gpu-metrics", type=_bool, default=DEFAULTS.gpu_metrics)
    p.add_argument("--allow-cpu-metrics", type=_bool, default=DEFAULTS.cpu_metrics)
    p.add_argument("--metrics-interval-ms", type=triton_flags.parse_float, default=DEFAULTS.metrics_interval * 1000)
    p.add_argument("--trace-config", action="append", default=[], metavar="[triton,]KEY=VALUE",
                   help="tracing: file=PATH, level=OFF|TIMESTAMPS, rate=N, count=N, log-frequency=N")
    p.add_argument("--cache-config", action="append", default=[], metavar="local,size=BYTES",
                   help="the response cache, for models whose config enables response_cache")
    p.add_argument("--model-control-mode", type=triton_flags.parse_mode, choices=("none", "poll", "explicit"),
                   default=DEFAULTS.model_control)
    p.add_argument("--load-model", action="append", default=[], metavar="NAME",
                   help="with --model-control-mode=explicit: a model to load at startup ('*' for all)")
    p.add_argument("--repository-poll-secs", type=triton_flags.parse_float, default=DEFAULTS.poll_secs)
    p.add_argument("--allow-client-shm", type=_bool, default=DEFAULTS.allow_client_shm,
                   help="let clients register system shared-memory regions (off by default, as in Triton)")
    p.add_argument("--grpc-engine", choices=("builtin", "grpcio"), default="builtin",
                   help="what carries gRPC: this server's own HTTP/2 (builtin, the fast one) or grpc.aio")
    p.add_argument("--grpc-use-ssl", type=_bool, default=False)
    p.add_argument("--grpc-use-ssl-mutual", type=_bool, default=False)
    p.add_argument("--grpc-server-cert", default="")
    p.add_argument("--grpc-server-key", default="")
    p.add_argument("--grpc-root-cert", default="")
    p.add_argument("--log-verbose", type=triton_flags.parse_int_bool, default=DEFAULTS.log_verbose)
    p.add_argument("--log-info", type=_bool, default=True)
    p.add_argument("--log-warning", type=_bool, default=True)
    p.add_argument("--log-error", type=_bool, default=True)
    p.add_argument("--log-format", choices=("default", "ISO8601"), default="default")
    p.add_argument("--log-file", default="")
    p.add_argument("--strict-readiness", type=_bool, default=DEFAULTS.strict_readiness)
    p.add_argument("--exit-on-error", type=_bool, default=DEFAULTS.exit_on_error,
                   help="exit when a model fails to load at startup (Triton's default)")
    p.add_argument("--exit-timeout-secs", type=triton_flags.parse_float, default=DEFAULTS.exit_timeout)
    p.add_argument("--disable-auto-complete-config", action="store_true")
    p.add_argument("--strict-model-config", type=_bool, default=None,
                   help="deprecated Triton spelling of --disable-auto-complete-config")
    p.add_argument("--workers", type=_workers, default=DEFAULTS.workers,
                   help="instances for models without instance_group: auto (one per visible GPU, or one "
                        "CPU instance without GPUs) or a count")
    p.add_argument("--execution-timeout-secs", type=float, default=DEFAULTS.execution_timeout,
                   help="kill and restart a worker whose batch runs longer than this (0: no limit); a model "
                        "may set its own with the config parameter execution_timeout_secs")
    p.add_argument("--model-load-timeout-secs", type=float, default=DEFAULTS.load_timeout,
                   help="kill a worker that has not loaded its model after this long, failing the load (0: wait "
                        "forever)")
    p.add_argument("--busy-poll-us", type=_count, default=DEFAULTS.busy_poll_us, metavar="US",
                   help="after sending a batch to a worker, and after its answer, the server polls for up to "
                        "this many microseconds instead of sleeping, which saves a wake-up's latency at low "
                        "concurrency at the cost of a busy core meanwhile (0: never poll)")
    p.add_argument("--http-max-input-size", type=int, default=64 << 20, metavar="BYTES",
                   help="the largest HTTP request body, as received and as decompressed (413 beyond it)")
    p.add_argument("--http-header-timeout-secs", type=float, default=10.0,
                   help="close a connection that has not sent a request's headers within this, or a gRPC "
                        "connection its HTTP/2 preface or a frame other than DATA it has begun (0: no limit)")
    p.add_argument("--http-body-timeout-secs", type=float, default=60.0,
                   help="close a connection whose request body stalls this long, or a gRPC connection that "
                        "has not finished a DATA frame it began within this (0: no limit)")
    p.add_argument("--http-keepalive-timeout-secs", type=float, default=5.0,
                   help="close an idle keep-alive connection after this long")
    p.add_argument("--max-connections", type=int, default=0,
                   help="open connections per listener (HTTP, gRPC, metrics) beyond which new ones are closed at "
                        "once (0: half the process's file-descriptor limit)")
    p.add_argument("--grpc-max-input-size", type=int, default=(1 << 31) - 1, metavar="BYTES",
                   help="the largest gRPC request message, as received and as decompressed (RESOURCE_EXHAUSTED "
                        "beyond it; a message whose prefix declares more is refused before its bytes are read); "
                        "default Triton's, INT32_MAX")
    p.add_argument("--worker-heap-retain-mb", type=_retain_mib, default=DEFAULTS.heap_retain_bytes >> 20, metavar="MIB",
                   help="memory a worker's model frees is kept, up to this many MiB, for its next allocations "
                        "instead of going back to the kernel at once, so a model that makes large arrays per "
                        "request does not fault in fresh pages for each; all of it goes back after 10 s "
                        "without a batch (0: the C library's own policy; at most 2047)")
    p.add_argument("--worker-start", choices=["fork", "exec"], default=DEFAULTS.worker_start,
                   help="how worker processes start: forked from a template process per backend, which has "
                        "imported what that backend's workers need once for all of them to share (fork), or "
                        "each with a fresh interpreter that imports everything itself (exec)")
    p.add_argument("--load-on-demand", action="store_true",
                   help="load a model of the repositories when a request first asks for it (the request waits for "
                        "the load) instead of at startup; with --model-control-mode none or explicit")
    p.add_argument("--max-resident-models", type=_count, default=DEFAULTS.max_resident_models, metavar="N",
                   help="with --load-on-demand: unload the least recently used models not in use when loading one "
                        "more would make more than N resident (0: no limit)")
    p.add_argument("--max-resident-memory-mb", type=_count, default=DEFAULTS.max_resident_memory_bytes >> 20,
                   metavar="MIB",
                   help="with --load-on-demand: the same, when the resident models' workers would take more than "
                        "this much memory (PSS) (0: no limit)")
    p.add_argument("--load-on-demand-timeout-secs", type=float, default=DEFAULTS.load_on_demand_wait, metavar="SECONDS",
                   help="with --load-on-demand: how long a request waits for its model to load before it fails "
                        "UNAVAILABLE (the load goes on; 0: as long as it takes)")
    p.add_argument("--arena-mb", type=int, default=DEFAULTS.arena_bytes >> 20,
                   help="size of each worker's input and output shared-memory arena, in MiB")
    triton_flags.add_to(p)
    return p


def given_flags(parser: argparse.ArgumentParser, args: argparse.Namespace) -> dict[str, object]:
    """The settings that differ from their defaults, by flag name (for the status page)."""
    flags: dict[str, object] = {}
    for action in parser._actions:
        if not action.option_strings or action.dest in ("help", "version"):
            continue
        value = getattr(args, action.dest, None)
        if value != action.default:
            flags[action.option_strings[0]] = value if isinstance(value, (str, int, float, bool, type(None))) \
                else [str(v) for v in value] if isinstance(value, list) else str(value)
    return flags


def serve(argv: list[str]) -> int:
    parser = serve_parser()
    args = parser.parse_args(argv)
    from .observability.log_settings import LogSettings

    try:
        log_settings = LogSettings(args.log_verbose, args.log_info, args.log_warning, args.log_error,
                                   args.log_format, args.log_file)
    except OSError as e:
        print(f"tritonmp: cannot open --log-file: {e}", file=sys.stderr)
        return 1
    log = get_logger("cli")
    triton_flags.warn_ignored(args, log)
    try:
        http_restrictions = Restrictions(args.http_restricted_api, "--http-restricted-api")
        grpc_restrictions = Restrictions(args.grpc_restricted_protocol, "--grpc-restricted-protocol",
                                         GRPC_HEADER_PREFIX)
        max_batch_sizes = triton_flags.default_max_batch_sizes(triton_flags.backend_settings(args.backend_config, log))
        host_policies = parse_host_policies(args.host_policy)
        metrics = parse_metrics_config(dict(args.metrics_config))
        grpcio_options = triton_flags.grpcio_options(args)
    except ValueError as e:
        log.error("%s", e)
        return 1
    for name in ("file", "level", "rate", "count", "log-frequency"):  # Triton's older spellings of --trace-config
        args.trace_config += [f"{name}={v}" for v in getattr(args, "trace_" + name.replace("-", "_"))]
    if args.response_cache_byte_size > 0 and not args.cache_config:
        args.cache_config = [f"local,size={args.response_cache_byte_size}"]
    if args.model_repository is None:  # on Vertex AI: its storage URI
        args.model_repository = [os.environ["AIP_STORAGE_URI"]]
    for repo in args.model_repository:
        problem = repository_problem(repo)
        if problem:
            log.error("%s", problem)
            return 1
    use_ssl = bool(args.grpc_use_ssl or args.grpc_use_ssl_mutual)
    if use_ssl:
        if not (args.grpc_server_cert and args.grpc_server_key):
            log.error("--grpc-use-ssl needs --grpc-server-cert and --grpc-server-key")
            return 1
        if args.grpc_use_ssl_mutual and not args.grpc_root_cert:
            log.error("--grpc-use-ssl-mutual needs --grpc-root-cert to check client certificates")
            return 1
    from .command import Command
    from .frontends.http2 import Keepalive
    from .frontends.listeners import (
        GrpcListener,
        GrpcSettings,
        HttpListener,
        HttpSettings,
        Listener,
        MetricsListener,
        MetricsSettings,
        SagemakerListener,
        SagemakerSettings,
        VertexAiListener,
        VertexAiSettings,
        check_ports,
    )
    from .gpus import visible_gpus

    auto_complete = not args.disable_auto_complete_config and not args.strict_model_config
    settings = ServerSettings(
        repositories=[r if is_remote(r) else os.path.abspath(r) for r in args.model_repository], workers=args.workers,
        auto_complete=auto_complete, default_max_batch_sizes=max_batch_sizes, config_name=args.model_config_name,
        gpus=visible_gpus(), host_policies=host_policies, arena_bytes=args.arena_mb << 20, log_verbose=args.log_verbose,
        execution_timeout=args.execution_timeout_secs, load_timeout=args.model_load_timeout_secs,
        busy_poll_us=args.busy_poll_us, heap_retain_bytes=args.worker_heap_retain_mb << 20,
        worker_start=args.worker_start, load_on_demand=args.load_on_demand,
        backend_directory=os.path.abspath(args.backend_directory) if args.backend_directory else "",
        python_env_cache=args.python_env_cache, python_env_from_requirements=args.python_env_from_requirements,
        max_resident_models=args.max_resident_models, max_resident_memory_bytes=args.max_resident_memory_mb << 20,
        load_on_demand_wait=args.load_on_demand_timeout_secs, load_threads=args.model_load_thread_count,
        load_retries=args.model_load_retry_count, model_namespacing=args.model_namespacing,
        rate_limit=args.rate_limit == "execution_count", rate_limit_resources=args.rate_limit_resource,
        metrics=metrics,
        model_control=args.model_control_mode, load_models=args.load_model, poll_secs=args.repository_poll_secs,
        server_id=args.id, strict_readiness=args.strict_readiness, allow_client_shm=args.allow_client_shm,
        exit_on_error=args.exit_on_error, exit_timeout=args.exit_timeout_secs,
        cpu_metrics=args.allow_cpu_metrics, gpu_metrics=args.allow_gpu_metrics,
        metrics_interval=max(0.1, args.metrics_interval_ms / 1000), flags=given_flags(parser, args))
    from .errors import ServerError
    from .observability.tracing import Tracer, settings_from_flags
    from .scheduling.response_cache import from_flags as cache_from_flags

    try:
        tracer = Tracer(*settings_from_flags(args.trace_config))
        cache = cache_from_flags(args.cache_config)
    except ServerError as e:
        log.error("%s", e)
        return 1
    try:
        settings.check(lambda name: FLAGS.get(name, name))
    except SettingsError as e:
        log.error("%s", e)
        return 1
    limits = Limits(args.http_header_timeout_secs, args.http_body_timeout_secs, args.http_keepalive_timeout_secs,
                    args.max_connections)
    tls = None
    if use_ssl:
        tls = {"server_cert": args.grpc_server_cert, "server_key": args.grpc_server_key,
               "root_cert": args.grpc_root_cert or "", "mutual": args.grpc_use_ssl_mutual}
    keepalive = Keepalive.from_triton_ms(
        args.grpc_keepalive_time, args.grpc_keepalive_timeout, args.grpc_keepalive_permit_without_calls,
        args.grpc_max_connection_age, args.grpc_max_connection_age_grace,
        args.grpc_http2_min_recv_ping_interval_without_data, args.grpc_http2_max_ping_strikes,
        preface_timeout=args.http_header_timeout_secs, data_timeout=args.http_body_timeout_secs)
    listeners: list[Listener] = []
    try:
        if args.allow_http:
            listeners.append(HttpListener(HttpSettings(
                args.http_address, args.http_port, restrictions=http_restrictions or None,
                header_forward=compile_pattern(args.http_header_forward_pattern, "--http-header-forward-pattern"),
                max_input_size=args.http_max_input_size, limits=limits, graceful_timeout=args.exit_timeout_secs)))
        if args.allow_metrics:
            listeners.append(MetricsListener(MetricsSettings(args.metrics_address, args.metrics_port, limits=limits)))
        if args.allow_sagemaker:
            listeners.append(SagemakerListener(SagemakerSettings.from_environment(
                os.environ, port=args.sagemaker_port, safe_range=args.sagemaker_safe_port_range,
                restrictions=http_restrictions or None, max_input_size=args.http_max_input_size, limits=limits)))
        if args.allow_vertex_ai:
            listeners.append(VertexAiListener(VertexAiSettings(
                port=args.vertex_ai_port, predict_route=os.environ.get("AIP_PREDICT_ROUTE", ""),
                health_route=os.environ.get("AIP_HEALTH_ROUTE", ""), default_model=args.vertex_ai_default_model,
                max_input_size=args.http_max_input_size, limits=limits)))
        if args.allow_grpc:
            listeners.append(GrpcListener(GrpcSettings(
                args.grpc_address, args.grpc_port, tls, keepalive, restrictions=grpc_restrictions or None,
                header_forward=compile_pattern(args.grpc_header_forward_pattern, "--grpc-header-forward-pattern"),
                max_input_size=args.grpc_max_input_size, max_connections=args.max_connections,
                engine=args.grpc_engine, grpcio_options=grpcio_options,
                response_compression=args.grpc_infer_response_compression_level)))
        check_ports([(service, address, port, allowed) for allowed_flag, service, address, port, allowed in (
            (args.allow_http, "HTTP", args.http_address, args.http_port, None),
            (args.allow_grpc, "GRPC", args.grpc_address, args.grpc_port, None),
            (args.allow_metrics, "metrics", args.metrics_address, args.metrics_port, None),
            (args.allow_sagemaker, "SageMaker", "0.0.0.0", args.sagemaker_port, args.sagemaker_safe_port_range),
            (args.allow_vertex_ai, "Vertex AI", "0.0.0.0", args.vertex_ai_port, None),
        ) if allowed_flag])
    except ValueError as e:
        log.error("%s", e)
        return 1

    async def main() -> int:
        return await Command(settings, listeners, log_settings, tracer, cache).run()

    try:
        import uvloop

        return uvloop.run(main())
    except ImportError:
        return asyncio.run(main())


def check(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="tritonmp check",
                                description="Validate model repositories without serving them.")
    p.add_argument("repositories", nargs="+", metavar="REPO")
    p.add_argument("--disable-auto-complete-config", action="store_true")
    p.add_argument("--backend-directory", default="", metavar="DIR", help="where python-based backends are")
    p.add_argument("--python-env-cache", default="", metavar="DIR",
                   help="where python models' environment archives are unpacked")
    p.add_argument("--python-env-from-requirements", action="store_true",
                   help="build a python model's environment from the requirements.txt beside its model.py")
    args = p.parse_args(argv)
    from .repository.check import check_repositories

    problems, models = check_repositories(args.repositories, not args.disable_auto_complete_config,
                                          os.path.abspath(args.backend_directory) if args.backend_directory else "",
                                          args.python_env_cache, args.python_env_from_requirements)
    for line in problems:
        print(line)
    n = len(problems)
    print(f"{models} model(s) checked, {n} problem(s) found" if n else f"{models} model(s) checked, all good")
    return 1 if n else 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "check":
        return check(argv[1:])
    if argv and argv[0] == "serve":
        argv = argv[1:]
    return serve(argv)
