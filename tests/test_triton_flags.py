"""Triton 2.51's command line: every flag of `tritonserver --help` is accepted; those with a meaning
here do what they say (--id, --backend-config default-max-batch-size, --model-config-name, the
older trace and cache spellings, gRPC keepalive and connection age); the rest are logged as ignored;
the access-restricting ones are refused rather than ignored."""

import socket
import struct
import subprocess
import time

import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from conftest import TRITONMP, X_TO_Y_CONFIG, write_model
from hostile_clients import h2frame
from make_example_repo import binary_op_model, write

# every flag of Triton 2.51's `tritonserver --help`, with a value it takes
TRITON_FLAGS = {
    "--id": "prod-a", "--exit-timeout-secs": "30", "--log-verbose": "0", "--log-info": "true",
    "--log-warning": "true", "--log-error": "true", "--log-format": "default", "--exit-on-error": "true",
    "--disable-auto-complete-config": None, "--strict-readiness": "true", "--model-control-mode": "none",
    "--repository-poll-secs": "15", "--model-config-name": "", "--model-load-thread-count": "4",
    "--model-load-retry-count": "0", "--model-namespacing": "false", "--enable-peer-access": "true",
    "--allow-http": "true", "--http-address": "127.0.0.1", "--reuse-http-port": "false",
    "--http-header-forward-pattern": "x-.*", "--http-thread-count": "8", "--allow-grpc": "true",
    "--grpc-address": "127.0.0.1", "--reuse-grpc-port": "false", "--grpc-header-forward-pattern": "x-.*",
    "--grpc-infer-allocation-pool-size": "8", "--grpc-use-ssl": "false", "--grpc-use-ssl-mutual": "false",
    "--grpc-infer-response-compression-level": "none", "--grpc-keepalive-time": "7200000",
    "--grpc-keepalive-timeout": "20000", "--grpc-keepalive-permit-without-calls": "false",
    "--grpc-http2-max-pings-without-data": "2", "--grpc-http2-min-recv-ping-interval-without-data": "300000",
    "--grpc-http2-max-ping-strikes": "2", "--grpc-max-connection-age": "0", "--grpc-max-connection-age-grace": "0",
    "--allow-sagemaker": "false", "--sagemaker-port": "8080", "--sagemaker-safe-port-range": "8081-8085",
    "--sagemaker-thread-count": "8", "--allow-vertex-ai": "false", "--vertex-ai-port": "8080",
    "--vertex-ai-thread-count": "8", "--vertex-ai-default-model": "add", "--allow-metrics": "true",
    "--allow-gpu-metrics": "true", "--allow-cpu-metrics": "true", "--metrics-address": "127.0.0.1",
    "--metrics-interval-ms": "2000", "--metrics-config": "summary_latencies=false",
    "--backend-directory": "/opt/tritonserver/backends", "--backend-config": "python,shm-default-byte-size=1048576",
    "--repoagent-directory": "/opt/tritonserver/repoagents", "--cache-directory": "/opt/tritonserver/caches",
    "--rate-limit": "off", "--rate-limit-resource": "R1:10:0", "--pinned-memory-pool-byte-size": "268435456",
    "--cuda-memory-pool-byte-size": "0:67108864", "--cuda-virtual-address-size": "0:1073741824",
    "--min-supported-compute-capability": "6.0", "--buffer-manager-thread-count": "0",
    "--host-policy": "numa0,numa-node=0", "--model-load-gpu-limit": "0:0.8", "--strict-model-config": "false",
    "--response-cache-byte-size": "0", "--trace-file": "/tmp/trace.json", "--trace-level": "OFF",
    "--trace-rate": "1000", "--trace-count": "-1", "--trace-log-frequency": "0",
}


def _repo(tmp_path):
    repo = tmp_path / "repo"
    write(binary_op_model("Add"), str(repo / "add" / "1" / "model.onnx"))  # no config.pbtxt: auto-complete
    return repo


def test_every_triton_flag_is_accepted_and_the_ignored_ones_are_named(start_server, tmp_path):
    args = []
    for flag, value in TRITON_FLAGS.items():
        if flag in ("--disable-auto-complete-config", "--model-config-name", "--http-address", "--grpc-address",
                    "--metrics-address"):
            continue  # these change what the test looks at; their own tests are below and elsewhere
        args.append(f"{flag}={value}")
    args.append("--backend-config=default-max-batch-size=8")
    server = start_server([_repo(tmp_path)], *args)
    log = server.log()
    assert ("--http-thread-count=8: a Triton flag this server accepts and ignores (HTTP is served by the frontend's "
            "event loop, not a thread pool)") in log
    assert "--pinned-memory-pool-byte-size=268435456: a Triton flag this server accepts and ignores" in log
    assert "--backend-config=python,shm-default-byte-size=1048576: the python backend's setting " \
           "'shm-default-byte-size' has no meaning in this server and is ignored" in log
    assert httpclient.InferenceServerClient(server.url).get_server_metadata()["name"] == "prod-a"
    assert grpcclient.InferenceServerClient(server.grpc_url).get_server_metadata().name == "prod-a"
    # default-max-batch-size reaches auto-complete
    assert httpclient.InferenceServerClient(server.url).get_model_config("add")["max_batch_size"] == 8


def test_malformed_and_unknown_flags_are_errors(tmp_path):
    for flag, message in (("--http-restricted-api=model-repository,admin-key=secret", "expected --http-restricted-api="
                           "<apis>:<key>=<value>"),
                          ("--grpc-restricted-protocol=everything:admin-key=secret",
                           "unknown restricted protocol 'everything'"),
                          ("--http-restricted-api=model-reposit,health:k1=v1",
                           "unknown restricted api 'model-reposit'"),
                          ("--not-a-triton-flag=1", "unrecognized arguments: --not-a-triton-flag=1")):
        result = subprocess.run([*TRITONMP, "--model-repository", str(_repo(tmp_path)), flag],
                                capture_output=True, text=True, timeout=60)
        assert result.returncode in (1, 2) and message in result.stderr + result.stdout, result.stderr
    # Triton's qa words for an API in two groups, HTTP and gRPC
    for flag, kind in (("--http-restricted-api", "api"), ("--grpc-restricted-protocol", "protocol")):
        result = subprocess.run([*TRITONMP, "--model-repository", str(_repo(tmp_path)),
                                 f"{flag}=model-repository,health:k1=v1", f"{flag}=metadata,health:k2=v2"],
                                capture_output=True, text=True, timeout=60)
        assert result.returncode == 1
        assert f"{kind} 'health' can not be specified in multiple config groups" in result.stderr + result.stdout


def test_model_config_name_picks_the_named_config(start_server, tmp_path):
    repo = _repo(tmp_path)
    (repo / "add" / "configs").mkdir()
    (repo / "add" / "configs" / "h100.pbtxt").write_text('platform: "onnxruntime_onnx"\nmax_batch_size: 2\n')
    server = start_server([repo], "--model-config-name=h100")
    assert httpclient.InferenceServerClient(server.url).get_model_config("add")["max_batch_size"] == 2


def test_grpc_keepalive_pings_and_closes_a_silent_connection(start_server, tmp_path):
    server = start_server([_repo(tmp_path)], "--grpc-keepalive-time=200", "--grpc-keepalive-timeout=300",
                          "--grpc-keepalive-permit-without-calls=true")
    with socket.create_connection(("127.0.0.1", server.grpc_port), timeout=10) as s:
        s.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + h2frame(4, 0, 0))
        started = time.monotonic()
        data = b""
        while True:  # read until the server ends the connection: it PINGs, gets no ACK, and closes
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
        took = time.monotonic() - started
    frames, pos = [], 0
    while pos + 9 <= len(data):
        n = int.from_bytes(data[pos:pos + 3], "big")
        frames.append((data[pos + 3], data[pos + 4], data[pos + 9:pos + 9 + n]))
        pos += 9 + n
    assert (6, 0, b"tmp-keep") in frames  # a keepalive PING
    assert frames[-1][0] == 7 and b"keepalive timeout" in frames[-1][2]  # then GOAWAY
    assert 0.4 < took < 10
    # a client that answers is kept: three keepalive PINGs, each acknowledged, and no GOAWAY
    with socket.create_connection(("127.0.0.1", server.grpc_port), timeout=10) as s:
        s.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + h2frame(4, 0, 0))
        buf, pings = b"", 0
        while pings < 3:
            chunk = s.recv(65536)
            assert chunk, "the server closed a connection that answered its PINGs"
            buf += chunk
            while len(buf) >= 9 and len(buf) >= 9 + int.from_bytes(buf[:3], "big"):
                n = int.from_bytes(buf[:3], "big")
                kind, flags, payload = buf[3], buf[4], buf[9:9 + n]
                buf = buf[9 + n:]
                assert kind != 7, f"GOAWAY: {payload!r}"
                if kind == 6 and not flags & 1:
                    s.sendall(h2frame(6, 1, 0, payload))
                    pings += 1
    assert grpcclient.InferenceServerClient(server.grpc_url).is_server_live()


def test_grpc_ping_strikes_end_a_connection_that_pings_too_often_without_calls(start_server, tmp_path):
    server = start_server([_repo(tmp_path)], "--grpc-http2-min-recv-ping-interval-without-data=60000",
                          "--grpc-http2-max-ping-strikes=1")
    with socket.create_connection(("127.0.0.1", server.grpc_port), timeout=10) as s:
        s.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + h2frame(4, 0, 0) + h2frame(6, 0, 0, b"pingping") * 4)
        data = b""
        while True:  # the first PING and one strike are answered; the next strike ends the connection
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
    assert data.count(h2frame(6, 1, 0, b"pingping")) == 2
    goaway = data[data.index(b"too_many_pings") - 17:]  # its frame header, last stream id and error code
    assert goaway[3] == 7 and goaway[13:17] == struct.pack(">I", 0xB)  # GOAWAY ENHANCE_YOUR_CALM
    assert grpcclient.InferenceServerClient(server.grpc_url).is_server_live()  # others keep being served


def test_grpc_pings_after_each_answer_are_not_strikes(start_server, tmp_path):
    """grpc clients PING to measure the bandwidth after a response's data arrives, often once the call
    has ended: an answer sent since the last PING forgives the strikes, as in grpc's own servers."""
    import hpack

    server = start_server([_repo(tmp_path)], "--grpc-http2-min-recv-ping-interval-without-data=60000",
                          "--grpc-http2-max-ping-strikes=1")
    encoder = hpack.Encoder()
    with socket.create_connection(("127.0.0.1", server.grpc_port), timeout=10) as s:
        s.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + h2frame(4, 0, 0))
        buf, acks, ended = b"", 0, set()

        def read_until(done):
            nonlocal buf, acks
            while not done():
                chunk = s.recv(65536)
                assert chunk, "the server closed a connection whose PINGs each followed an answer"
                buf += chunk
                while len(buf) >= 9 and len(buf) >= 9 + int.from_bytes(buf[:3], "big"):
                    n = int.from_bytes(buf[:3], "big")
                    kind, flags, stream = buf[3], buf[4], int.from_bytes(buf[5:9], "big")
                    assert kind != 7, f"GOAWAY: {buf[9:9 + n]!r}"
                    acks += kind == 6 and flags & 1
                    if kind == 1 and flags & 1:  # trailers: the call has ended
                        ended.add(stream)
                    buf = buf[9 + n:]

        for call in range(6):
            sid = 2 * call + 1
            headers = encoder.encode([(":method", "POST"), (":scheme", "http"), (":authority", "x"),
                                      (":path", "/inference.GRPCInferenceService/ServerLive"),
                                      ("content-type", "application/grpc"), ("te", "trailers")])
            s.sendall(h2frame(1, 4, sid, headers) + h2frame(0, 1, sid, b"\0\0\0\0\0"))
            read_until(lambda sid=sid: sid in ended)
            s.sendall(h2frame(6, 0, 0, b"bdp-ping"))  # after the call has ended: no call open
        read_until(lambda: acks == 6)


# Value forms Triton 2.51's parser takes, and those it refuses, by kind (tests/test_compat.py checks
# each against Triton itself)
FORMS = {
    "boolean": {"TRUE": True, "On": True, "1": True, "false": False, "OFF": False, "0": False,
                "yes": None, "t": None, "": None},
    "integer": {"42": 42, "+7": 7, "-1": -1, " 12": 12, "8000.5": 8000, "3abc": 3, "1e3": 1, "abc": None, "": None},
    "float": {"1.5": 1.5, "2e3": 2000.0, ".5": 0.5, "7": 7.0, "3ms": 3.0, "abc": None},
}


def _parsed(flag: str, value: str):
    """What the serve parser makes of `flag=value`; None where it refuses it."""
    from tritonmp import triton_flags

    parser = triton_flags.parser_of(flag)
    assert parser is not None, flag
    try:
        return parser(value)
    except Exception:
        return None


def test_every_triton_flag_reads_its_values_as_triton_does():
    """Each boolean, integer and float flag of Triton's is read by its kind's parser (or a wider one,
    named), in the serve parser itself; each kind takes and refuses Triton's forms."""
    from tritonmp import cli, triton_flags

    actions = {o: a for a in cli.serve_parser()._actions for o in a.option_strings}
    for kind, flags in triton_flags.KINDS.items():
        for flag in flags:
            assert actions[flag].type is triton_flags.parser_of(flag), flag
            if flag not in triton_flags.WIDER:
                assert triton_flags.parser_of(flag) is triton_flags.PARSERS[kind], flag
    for kind, forms in FORMS.items():
        for value, want in forms.items():
            assert _parsed(triton_flags.KINDS[kind][-1], value) == want, (kind, value)
    assert [_parsed("--log-verbose", v) for v in ("true", "FALSE", "2", "yes")] == [1, 0, 2, None]
    args = cli.serve_parser().parse_args(["--model-repository", "/m", "--model-control-mode=POLL", "--log-verbose=true",
                                          "--allow-http=On", "--http-port=8000.5"])
    assert (args.model_control_mode, args.log_verbose, args.allow_http, args.http_port) == ("poll", 1, True, 8000)


SLOW_INIT_PY = """
import os, time
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        with open({log!r}, "a") as f:
            f.write(f"start {{time.monotonic()}}\\n")
        time.sleep(0.6)
        with open({log!r}, "a") as f:
            f.write(f"end {{time.monotonic()}}\\n")

    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("Y", pb_utils.get_input_tensor_by_name(r, "X").as_numpy())])
                for r in requests]
"""

FAILS_ONCE_PY = """
import os
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        if not os.path.exists({marker!r}):
            open({marker!r}, "w").close()
            raise RuntimeError("the first load of this model fails")

    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("Y", pb_utils.get_input_tensor_by_name(r, "X").as_numpy())])
                for r in requests]
"""

def _most_at_once(log) -> int:
    events = sorted((float(t), 1 if kind == "start" else -1)
                    for kind, t in (line.split() for line in log.read_text().splitlines()))
    running = most = 0
    for _, change in events:
        running += change
        most = max(most, running)
    return most


def test_model_load_thread_count_bounds_the_models_loading_at_once(start_server, tmp_path):
    for count in (1, 3):
        repo, log = tmp_path / f"repo{count}", tmp_path / f"loads{count}.txt"
        for name in ("a", "b", "c"):
            write_model(repo, name, SLOW_INIT_PY.format(log=str(log)), X_TO_Y_CONFIG)
        start_server([repo], f"--model-load-thread-count={count}")
        assert _most_at_once(log) == count, log.read_text()


def test_model_load_retry_count_tries_a_failed_load_again(start_server, tmp_path):
    for retries, ready in ((0, False), (1, True)):
        repo = tmp_path / f"repo{retries}"
        write_model(repo, "flaky", FAILS_ONCE_PY.format(marker=str(tmp_path / f"marker{retries}")),
                    X_TO_Y_CONFIG)
        server = start_server([repo], f"--model-load-retry-count={retries}", "--exit-on-error=false",
                              "--strict-readiness=false")
        assert httpclient.InferenceServerClient(server.url).is_model_ready("flaky") is ready, server.log()
        assert ("trying again (1 of 1)" in server.log()) is ready
