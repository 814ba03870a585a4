"""The command line: both entry points, Triton's flag names, --workers."""

import os
import socket
import subprocess
import sys

import orjson

from conftest import TRITONMP, free_ports


def test_console_script_and_module_both_run():
    script = os.path.join(os.path.dirname(sys.executable), "tritonmp")
    for cmd in ([script, "--help"], [*TRITONMP, "--help"]):
        result = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, result.stderr
        for flag in ("--model-repository", "--http-port", "--grpc-port", "--metrics-port", "--http-address",
                     "--log-verbose", "--strict-readiness", "--exit-timeout-secs",
                     "--disable-auto-complete-config", "--workers"):
            assert flag in result.stdout


def test_bad_flag_values_are_refused():
    result = subprocess.run([*TRITONMP, "--model-repository", ".", "--workers", "zero"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert "expected 'auto' or a positive count" in result.stderr
    result = subprocess.run([*TRITONMP, "--model-repository", ".", "--busy-poll-us", "-5"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "expected 0 or a positive number" in result.stderr
    result = subprocess.run([*TRITONMP, "--model-repository", ".", "--worker-heap-retain-mb", "4096"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "expected 0 to 2047 (MiB), got '4096'" in result.stderr


def test_flags_that_contradict_each_other_are_refused_in_the_flags_own_words(tmp_path):
    cases = [(["--load-model", "add"], "--load-model needs --model-control-mode explicit"),
             (["--load-on-demand", "--model-control-mode", "poll"],
              "--load-on-demand works with --model-control-mode none or explicit"),
             (["--max-resident-models", "2"],
              "--max-resident-models and --max-resident-memory-mb need --load-on-demand")]
    for flags, words in cases:
        result = subprocess.run([*TRITONMP, "--model-repository", str(tmp_path), "--http-port", "0", *flags],
                                capture_output=True, text=True, timeout=60)
        assert result.returncode == 1 and words in result.stderr, (flags, result.stderr)


def test_the_command_line_takes_its_defaults_from_the_settings():
    from tritonmp.cli import serve_parser
    from tritonmp.settings import DEFAULTS

    args = serve_parser().parse_args(["--model-repository", "."])
    assert (args.model_load_timeout_secs, args.execution_timeout_secs, args.busy_poll_us, args.workers,
            args.load_on_demand_timeout_secs, args.arena_mb << 20, args.worker_heap_retain_mb << 20, args.id) == (
        DEFAULTS.load_timeout, DEFAULTS.execution_timeout, DEFAULTS.busy_poll_us, DEFAULTS.workers,
        DEFAULTS.load_on_demand_wait, DEFAULTS.arena_bytes, DEFAULTS.heap_retain_bytes, DEFAULTS.server_id)


def test_missing_repository_is_an_error(tmp_path):
    result = subprocess.run([*TRITONMP, "--model-repository", str(tmp_path / "nope"), "--http-port", "0"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    assert "is not a directory" in result.stderr


def test_workers_count_sets_instances_of_models_without_instance_group(start_server, example_repo):
    server = start_server([example_repo], "--workers", "2")
    config = orjson.loads(server.get("/v2/models/add/config")[2])
    assert [(g["kind"], g["count"]) for g in config["instance_group"]] == [("KIND_CPU", 2)]
    log = server.log()
    assert "worker add_0 of model 'add'" in log and "worker add_1 of model 'add'" in log
    # add_py names its own instance_group: --workers leaves it alone
    assert "add_py_0_1" not in log


def test_bad_trace_and_cache_configs_are_refused(tmp_path):
    for flag, value, message in (("--trace-config", "colour=red", "expected [triton,]KEY=VALUE"),
                                 ("--cache-config", "redis,size=10", "only the 'local' cache is available"),
                                 ("--cache-config", "local,size=lots", "expected local,size=BYTES")):
        result = subprocess.run([*TRITONMP, "--model-repository", str(tmp_path), flag, value],
                                capture_output=True, text=True, timeout=60)
        assert result.returncode == 1, flag
        assert message in result.stderr


def test_a_busy_port_is_a_clear_error(tmp_path):
    (http_port, grpc_port, metrics_port) = free_ports(3)
    for busy, engine in (("--http-port", "builtin"), ("--grpc-port", "builtin"), ("--grpc-port", "grpcio")):
        with socket.create_server(("0.0.0.0", 0)) as taken:
            ports = {"--http-port": http_port, "--grpc-port": grpc_port, "--metrics-port": metrics_port,
                     busy: taken.getsockname()[1]}
            result = subprocess.run([*TRITONMP, "--model-repository", str(tmp_path), "--grpc-engine", engine,
                                     *[str(x) for kv in ports.items() for x in kv]],
                                    capture_output=True, text=True, timeout=60)
        assert result.returncode == 1, busy
        assert "cannot serve:" in result.stderr and "in use" in result.stderr, result.stderr
        assert "Traceback" not in result.stderr
