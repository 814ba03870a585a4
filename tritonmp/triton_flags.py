"""The rest of Triton 2.51's command line: the flags `tritonserver --help` lists beyond those the
server implements in cli.py. Deployment files written for Triton pass them, so each is accepted.
Those that mean something here are turned into this server's settings (`apply`); the others are
logged once each, by name, as accepted and ignored, with the reason.
"""

from __future__ import annotations

import argparse
import logging
import re

from .instances.rate_limiter import parse_resource
from .settings import DEFAULTS

# flag -> why it means nothing in this server
IGNORED = {
    "--enable-peer-access": "CUDA peer access is the CUDA runtime's default for each worker",
    "--reuse-http-port": "the HTTP port is bound by this process alone",
    "--reuse-grpc-port": "the gRPC port is bound by this process alone",
    "--http-thread-count": "HTTP is served by the frontend's event loop, not a thread pool",
    "--grpc-infer-allocation-pool-size": "gRPC responses are not pooled",
    "--grpc-http2-max-pings-without-data": "it limits the pings a server sends with no data; the built-in engine "
                                           "pings only for keepalive (it applies with --grpc-engine grpcio)",
    "--sagemaker-thread-count": "SageMaker's requests are served by the frontend's event loop, not a thread pool",
    "--vertex-ai-thread-count": "Vertex AI's requests are served by the frontend's event loop, not a thread pool",
    "--repoagent-directory": "repository agents are not run",
    "--cache-directory": "the response cache is built in (--cache-config local,size=...)",
    "--pinned-memory-pool-byte-size": "tensors move through shared-memory arenas (--arena-mb)",
    "--cuda-memory-pool-byte-size": "each GPU worker allocates through its framework",
    "--cuda-virtual-address-size": "each GPU worker allocates through its framework",
    "--min-supported-compute-capability": "each framework checks its GPU itself",
    "--buffer-manager-thread-count": "there is no buffer manager",
    "--model-load-gpu-limit": "GPU memory is not budgeted per load",
}
# --backend-config settings this server honours, per backend ("" for every backend)
BACKEND_SETTINGS = {"default-max-batch-size"}


def add_to(parser: argparse.ArgumentParser) -> None:
    """Add Triton's remaining flags to the serve parser."""
    for flag in IGNORED:
        parser.add_argument(flag, action="append", metavar="VALUE", dest=_dest(flag), help=argparse.SUPPRESS,
                            type=parser_of(flag))
    parser.add_argument("--http-restricted-api", action="append", default=[], metavar="APIS:KEY=VALUE",
                        help="only requests with the header KEY: VALUE reach these API groups (Triton's flag)")
    parser.add_argument("--grpc-restricted-protocol", action="append", default=[], metavar="PROTOCOLS:KEY=VALUE",
                        help="only calls with the metadata triton-grpc-protocol-KEY: VALUE reach these groups")
    parser.add_argument("--http-header-forward-pattern", default="", metavar="REGEX",
                        help="HTTP request headers whose name this matches reach the model as request parameters")
    parser.add_argument("--grpc-header-forward-pattern", default="", metavar="REGEX",
                        help="gRPC request metadata whose key this matches reach the model as request parameters")
    parser.add_argument("--id", default=DEFAULTS.server_id, help="the server's name in its metadata")
    parser.add_argument("--backend-config", action="append", default=[], metavar="[BACKEND,]SETTING=VALUE",
                        help="Triton's backend settings: default-max-batch-size is honoured, others are ignored")
    parser.add_argument("--backend-directory", default=DEFAULTS.backend_directory, metavar="DIR",
                        help="python-based backends: a model with backend: \"NAME\" runs DIR/NAME/model.py "
                             "(the built-in backends need none)")
    parser.add_argument("--python-env-cache", default=DEFAULTS.python_env_cache, metavar="DIR",
                        help="where python models' environment archives (EXECUTION_ENV_PATH) are unpacked, once "
                             "per archive content (default: ~/.cache/tritonmp/python-envs)")
    parser.add_argument("--python-env-from-requirements", type=parse_bool,
                        default=DEFAULTS.python_env_from_requirements, metavar="BOOL",
                        help="a python model with a requirements.txt beside its model.py and no EXECUTION_ENV_PATH "
                             "runs in an environment built from it (once per content, in --python-env-cache)")
    parser.add_argument("--model-config-name", default="",
                        help="read MODEL/configs/NAME.pbtxt where it exists instead of MODEL/config.pbtxt")
    parser.add_argument("--response-cache-byte-size", type=parse_int, default=0,
                        help="deprecated Triton spelling of --cache-config local,size=BYTES")
    for name in ("file", "level", "rate", "count", "log-frequency"):
        parser.add_argument(f"--trace-{name}", action="append", default=[], metavar="VALUE",
                            type=parser_of(f"--trace-{name}"),
                            help=f"deprecated Triton spelling of --trace-config {name}=VALUE")
    parser.add_argument("--model-load-thread-count", type=parse_int, default=DEFAULTS.load_threads, metavar="N",
                        help="models loading at once (their config checks and their workers' starts)")
    parser.add_argument("--model-load-retry-count", type=parse_int, default=DEFAULTS.load_retries, metavar="N",
                        help="times a failed load is tried again")
    parser.add_argument("--metrics-config", action="append", default=[], type=parse_setting, metavar="SETTING=VALUE",
                        help="counter_latencies, summary_latencies, summary_quantiles=Q:E,..., "
                             "summary_max_age=SECONDS, histogram_latencies: which latency metrics are exported, as "
                             "Triton's")
    parser.add_argument("--rate-limit", type=parse_mode, default="off", choices=("off", "execution_count"),
                        help="execution_count: an instance runs a batch only once the resources its instance group's "
                             "rate_limiter names are free, the least run weighed by priority first")
    parser.add_argument("--rate-limit-resource", action="append", default=[], type=parse_rate_limit_resource,
                        metavar="NAME:COUNT[:DEVICE]",
                        help="a resource the server has for the rate limiter (without a device, on every device); "
                             "a resource not given has the most any instance asks for")
    parser.add_argument("--model-namespacing", type=parse_bool, default=DEFAULTS.model_namespacing,
                        help="each model repository is a namespace: models of one name in several repositories "
                             "load side by side, an ensemble's and a BLS call's models are looked for in their own "
                             "repository first, and a request naming several is refused")
    parser.add_argument("--grpc-infer-response-compression-level", type=parse_mode, default="none",
                        choices=("none", "low", "medium", "high"),
                        help="compress infer responses with gzip or deflate, as gRPC picks them for the level among "
                             "those the client accepts")
    parser.add_argument("--host-policy", action="append", default=[], metavar="NAME,SETTING=VALUE",
                        help="where the workers of instances under policy NAME run: numa-node=N, cpu-cores=0-3,8 "
                             "(an instance group's host_policy names it; else gpu_<device>, cpu or model)")
    parser.add_argument("--allow-sagemaker", type=parse_bool, default=False,
                        help="serve Amazon SageMaker's endpoint (/ping, /invocations, /models)")
    parser.add_argument("--sagemaker-port", type=parse_int, default=8080)
    parser.add_argument("--sagemaker-safe-port-range", type=parse_range, default=None, metavar="LOW-HIGH",
                        help="the ports the other services must listen on, where on SageMaker's address")
    parser.add_argument("--grpc-keepalive-time", type=parse_int, default=7200000, metavar="MS")
    parser.add_argument("--grpc-keepalive-timeout", type=parse_int, default=20000, metavar="MS")
    parser.add_argument("--grpc-keepalive-permit-without-calls", type=parse_bool, default=False)
    parser.add_argument("--grpc-max-connection-age", type=parse_int, default=0, metavar="MS")
    parser.add_argument("--grpc-max-connection-age-grace", type=parse_int, default=0, metavar="MS")
    parser.add_argument("--grpc-http2-min-recv-ping-interval-without-data", type=parse_int, default=300000,
                        metavar="MS")
    parser.add_argument("--grpc-http2-max-ping-strikes", type=parse_int, default=2)


def _dest(flag: str) -> str:
    return "triton_" + flag.lstrip("-").replace("-", "_")


# The value forms of Triton's flags, as its command line parses them: a boolean is true, on or 1, or
# false, off or 0, in any case; an integer is C's strtol read of the value's start (" 12abc" is 12);
# a float C's strtod's; --log-verbose also takes true (1) and false (0); --model-control-mode any case.
_INTEGER = re.compile(r"\s*[+-]?\d+")
_FLOAT = re.compile(r"\s*[+-]?(?:(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?|inf(?:inity)?|nan)", re.IGNORECASE)


def parse_bool(text: str) -> bool:
    """Triton's boolean flag values."""
    value = text.lower()
    if value in ("1", "true", "on"):
        return True
    if value in ("0", "false", "off"):
        return False
    raise argparse.ArgumentTypeError(f"invalid value for bool option: {text}")


def parse_int(text: str) -> int:
    """Triton's integer flag values: the integer the value starts with."""
    m = _INTEGER.match(text)
    if m is None or not -(1 << 63) <= int(m.group()) < 1 << 63:
        raise argparse.ArgumentTypeError(f"expected an integer, got '{text}'")
    return int(m.group())


def parse_float(text: str) -> float:
    """Triton's float flag values (and of its integer ones this server takes in fractions, such as
    seconds): the number the value starts with."""
    m = _FLOAT.match(text)
    if m is None:
        raise argparse.ArgumentTypeError(f"expected a number, got '{text}'")
    return float(m.group())


def parse_int_bool(text: str) -> int:
    """--log-verbose: true is 1, false 0, else an integer."""
    value = text.lower()
    return 1 if value == "true" else 0 if value == "false" else parse_int(text)


def parse_range(text: str) -> tuple[int, int]:
    """--sagemaker-safe-port-range: LOW-HIGH."""
    low, sep, high = text.partition("-")
    if not sep:
        raise argparse.ArgumentTypeError(f"expected LOW-HIGH, got '{text}'")
    return parse_int(low), parse_int(high)


def parse_setting(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected <setting>=<value>, got '{text}'")
    return key, value


def parse_rate_limit_resource(text: str) -> tuple[str, int, int | None]:
    try:
        return parse_resource(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def parse_mode(text: str) -> str:
    """--model-control-mode, in any case."""
    return text.lower()


GRPCIO_ONLY = {"--grpc-http2-max-pings-without-data"}


def warn_ignored(args: argparse.Namespace, log: logging.Logger) -> None:
    for flag, why in IGNORED.items():
        values = getattr(args, _dest(flag))
        if values and not (flag in GRPCIO_ONLY and args.grpc_engine == "grpcio"):
            log.warning("%s=%s: a Triton flag this server accepts and ignores (%s)", flag, values[-1], why)


def backend_settings(values: list[str], log: logging.Logger) -> dict[str, dict[str, str]]:
    """--backend-config values as {backend ("" for all): {setting: value}}; the settings this server
    has no use for are logged as ignored. ValueError for a value that is not SETTING=VALUE."""
    out: dict[str, dict[str, str]] = {}
    for item in values:
        backend, _, rest = item.partition(",") if "," in item.split("=", 1)[0] else ("", "", item)
        setting, sep, value = rest.partition("=")
        if not sep or not setting:
            raise ValueError(f"--backend-config '{item}': expected [BACKEND,]SETTING=VALUE")
        if setting in BACKEND_SETTINGS:
            out.setdefault(backend, {})[setting] = value
        else:
            where = f"the {backend} backend's" if backend else "the"
            log.warning("--backend-config=%s: %s setting '%s' has no meaning in this server and is ignored",
                        item, where, setting)
    return out


def default_max_batch_sizes(settings: dict[str, dict[str, str]]) -> dict[str, int]:
    """{backend ("" for all): the max_batch_size auto-complete gives a batchable model}."""
    out = {}
    for backend, values in settings.items():
        if "default-max-batch-size" in values:
            text = values["default-max-batch-size"]
            if not text.isdigit():
                raise ValueError(f"--backend-config default-max-batch-size must be a non-negative integer, got "
                                 f"'{text}'")
            out[backend] = int(text)
    return out


def grpcio_options(args: argparse.Namespace) -> list[tuple[str, int]]:
    """The same settings as grpc.aio server options (Triton passes them to grpc the same way)."""
    options = [("grpc.keepalive_time_ms", args.grpc_keepalive_time),
               ("grpc.keepalive_timeout_ms", args.grpc_keepalive_timeout),
               ("grpc.keepalive_permit_without_calls", int(args.grpc_keepalive_permit_without_calls))]
    if args.grpc_max_connection_age:
        options.append(("grpc.max_connection_age_ms", args.grpc_max_connection_age))
    if args.grpc_max_connection_age_grace:
        options.append(("grpc.max_connection_age_grace_ms", args.grpc_max_connection_age_grace))
    options += [("grpc.http2.min_ping_interval_without_data_ms", args.grpc_http2_min_recv_ping_interval_without_data),
                ("grpc.http2.max_ping_strikes", args.grpc_http2_max_ping_strikes)]
    values = getattr(args, _dest("--grpc-http2-max-pings-without-data"))
    if values:
        options.append(("grpc.http2.max_pings_without_data", int(values[-1])))
    return options


# Triton 2.51's flags whose values it reads as booleans, integers or floats (`tritonserver --help`)
KINDS: dict[str, tuple[str, ...]] = {
    "boolean": ("--log-info", "--log-warning", "--log-error", "--exit-on-error", "--strict-readiness",
                "--model-namespacing", "--enable-peer-access", "--allow-http", "--reuse-http-port", "--allow-grpc",
                "--reuse-grpc-port", "--grpc-use-ssl", "--grpc-use-ssl-mutual", "--grpc-keepalive-permit-without-calls",
                "--allow-sagemaker", "--allow-vertex-ai", "--allow-metrics", "--allow-gpu-metrics",
                "--allow-cpu-metrics", "--strict-model-config"),
    "integer": ("--exit-timeout-secs", "--log-verbose", "--repository-poll-secs", "--model-load-thread-count",
                "--model-load-retry-count", "--http-port", "--http-thread-count", "--grpc-port",
                "--grpc-infer-allocation-pool-size", "--grpc-keepalive-time", "--grpc-keepalive-timeout",
                "--grpc-http2-max-pings-without-data", "--grpc-http2-min-recv-ping-interval-without-data",
                "--grpc-http2-max-ping-strikes", "--grpc-max-connection-age", "--grpc-max-connection-age-grace",
                "--sagemaker-port", "--sagemaker-thread-count", "--vertex-ai-port", "--vertex-ai-thread-count",
                "--metrics-port", "--pinned-memory-pool-byte-size", "--buffer-manager-thread-count",
                "--response-cache-byte-size", "--trace-rate", "--trace-count", "--trace-log-frequency"),
    "float": ("--metrics-interval-ms", "--min-supported-compute-capability"),
}
PARSERS = {"boolean": parse_bool, "integer": parse_int, "float": parse_float}
# where this server reads more than Triton's parser does: --log-verbose's true and false, and seconds
# in fractions
WIDER = {"--log-verbose": parse_int_bool, "--exit-timeout-secs": parse_float, "--repository-poll-secs": parse_float}


def parser_of(flag: str):
    """How a Triton flag's value is read here: its kind's parser (or a wider one); None for a string."""
    if flag in WIDER:
        return WIDER[flag]
    return next((PARSERS[kind] for kind, flags in KINDS.items() if flag in flags), None)
