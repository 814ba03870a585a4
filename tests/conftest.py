"""Fixtures that run the real tritonmp server as a subprocess on free ports and clean up after it:
its processes, and every shared-memory segment it could have left."""

from __future__ import annotations

import contextlib
import glob
import http.client
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE_REPO = ROOT / "configs" / "model_repository"
TEST_MODELS = Path(__file__).resolve().parent / "models"
# the suite's python-based backends: every server it starts is given them, unless a test says otherwise
TEST_BACKENDS = Path(__file__).resolve().parent / "backends"
# where the suite's servers unpack and remember python environments (removed when the session ends)
ENV_CACHE = Path(tempfile.gettempdir()) / f"tritonmp-test-env-cache-{os.getpid()}"
TRITONMP = [sys.executable, "-m", "tritonmp"]
# The Triton extensions server metadata must list: exactly those really served.
SERVED_EXTENSIONS = {"classification", "binary_tensor_data", "model_configuration", "parameters", "statistics",
                     "system_shared_memory", "cuda_shared_memory", "model_repository",
                     "model_repository(unload_dependents)", "logging", "trace"}

sys.path.insert(0, str(ROOT / "scripts"))

# Every server the suite starts, and the server code it imports, takes each request a fast path
# takes through the rules as well (tritonmp/testing.py): a rule its fast path misses fails a test.
os.environ["TRITONMP_CHECK_FAST_PATHS"] = "1"


POLL_INTERVAL = 0.05  # how often waits look again at the condition they wait for

# Why a test may skip in CI (CI=true): hardware or software CI cannot have (a GPU and its libraries, a
# container runtime). Any other skip fails there, so that a framework that stops importing, or a tool
# .ci/run could not install, cannot quietly take its tests away.
ALLOWED_CI_SKIPS = re.compile(r"GPU|CUDA|cuda|nvidia-ml-py|tensorrt|TensorRT|OpenVINO provider|podman|container")


def _skip_not_allowed(report) -> str | None:
    """The reason of a skip CI does not allow; None where it is allowed, or not a skip, or not CI."""
    if not report.skipped or os.environ.get("CI", "").lower() not in ("1", "true", "yes") \
            or getattr(report, "wasxfail", None) is not None:
        return None
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    return None if ALLOWED_CI_SKIPS.search(reason) else reason


def pytest_sessionfinish(session, exitstatus):
    shutil.rmtree(ENV_CACHE, ignore_errors=True)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    reason = _skip_not_allowed(report)
    if reason is not None:
        report.outcome = "failed"
        report.longrepr = f"skipped in CI for a reason CI does not allow (conftest.ALLOWED_CI_SKIPS): {reason}"


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    outcome = yield
    report = outcome.get_result()
    reason = _skip_not_allowed(report)
    if reason is not None:  # a whole module skipped, as an import that failed does
        report.outcome = "failed"
        report.longrepr = f"skipped in CI for a reason CI does not allow (conftest.ALLOWED_CI_SKIPS): {reason}"


def wait_for(condition, timeout: float, what: str) -> None:
    """Poll `condition` until it holds; AssertionError naming `what` when it does not in time."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(POLL_INTERVAL)
    raise AssertionError(f"timed out waiting for {what}")


def free_port() -> int:
    return free_ports(1)[0]


def free_ports(n: int, avoid: tuple[int, ...] = ()) -> list[int]:
    """n distinct free ports: all held open while they are chosen, so none is handed out twice,
    and none of `avoid` (ports handed to a server that may not have bound them yet)."""
    sockets = []
    try:
        while len(sockets) < n:
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            if s.getsockname()[1] in avoid:
                s.close()
                continue
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def http_request(port: int, method: str, path: str, body: bytes | None = None, headers=None,
                 timeout: float = 30.0) -> tuple[int, dict, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


def add_inputs(module, a, b=None):
    """Inputs A and B of the add models (B defaults to A), for tritonclient.http or .grpc."""
    from tritonclient.utils import np_to_triton_dtype

    b = a if b is None else b
    inputs = []
    for name, value in (("A", a), ("B", b)):
        tensor = module.InferInput(name, list(value.shape), np_to_triton_dtype(value.dtype))
        tensor.set_data_from_numpy(value)
        inputs.append(tensor)
    return inputs


def infer_add(client, model: str = "add", a=None, b=None, **options):
    """C of an add model for A and B (B defaults to A, A to ones of shape [1, 3]), over the client's
    protocol (tritonclient.http or .grpc); `options` go to its infer."""
    import numpy as np
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient

    module = grpcclient if isinstance(client, grpcclient.InferenceServerClient) else httpclient
    a = np.ones((1, 3), np.float32) if a is None else a
    return client.infer(model, add_inputs(module, a, b), **options).as_numpy("C")


# a python model taking X and answering Y, both FP32 of shape [1], unbatched
X_TO_Y_CONFIG = ('backend: "python"\nmax_batch_size: 0\n'
                 'input [ { name: "X", data_type: TYPE_FP32, dims: [ 1 ] } ]\n'
                 'output [ { name: "Y", data_type: TYPE_FP32, dims: [ 1 ] } ]\n')


def write_model(repo: Path, name: str, model_py: str, config: str) -> Path:
    """A python model `name` in `repo` (version 1), returning its directory."""
    model = repo / name
    (model / "1").mkdir(parents=True)
    (model / "1" / "model.py").write_text(model_py)
    (model / "config.pbtxt").write_text(config)
    return model


def scrape_metrics(server) -> dict[str, float]:
    """The server's /metrics as {'name{labels}': value}."""
    status, headers, body = http_request(server.metrics_port, "GET", "/metrics")
    assert status == 200 and headers["content-type"].startswith("text/plain")
    samples = {}
    for line in body.decode().splitlines():
        if line and not line.startswith("#"):
            key, value = line.rsplit(" ", 1)
            samples[key] = float(value)
    return samples


def shm_segments(pid: int) -> list[str]:
    return glob.glob(f"/dev/shm/tritonmp-{pid}-*")


class ServerProcess:
    """A running `tritonmp` process: its ports, its log, and helpers to wait on it."""

    def __init__(self, repos: list, args: list[str], log_path: Path, env: dict[str, str] | None = None):
        self.http_port, self.grpc_port, self.metrics_port = free_ports(3)
        self.log_path = log_path
        self.log_file = open(log_path, "wb")
        cmd = [*TRITONMP, "--http-port", str(self.http_port), "--grpc-port", str(self.grpc_port),
               "--metrics-port", str(self.metrics_port)]
        for repo in repos:
            cmd += ["--model-repository", str(repo)]
        if not any(a.startswith("--backend-directory") for a in args):
            cmd.append(f"--backend-directory={TEST_BACKENDS}")
        if not any(a.startswith("--python-env-cache") for a in args):
            cmd.append(f"--python-env-cache={ENV_CACHE}")
        env = dict(os.environ, PYTHONUNBUFFERED="1", **(env or {}))
        self.proc = subprocess.Popen(cmd + list(args), stdout=self.log_file, stderr=subprocess.STDOUT,
                                     env=env, start_new_session=True)
        self.url = f"127.0.0.1:{self.http_port}"
        self.grpc_url = f"127.0.0.1:{self.grpc_port}"

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def get(self, path: str) -> tuple[int, dict, bytes]:
        return http_request(self.http_port, "GET", path)

    def post(self, path: str, body: bytes, headers=None) -> tuple[int, dict, bytes]:
        return http_request(self.http_port, "POST", path, body, headers)

    def wait_until(self, condition, timeout: float = 60.0, what: str = "condition") -> None:
        """Poll `condition` until it holds; fail with the server's log when it does not."""
        def holds() -> bool:
            if self.proc.poll() is not None:
                raise AssertionError(f"server exited with {self.proc.returncode} waiting for {what}:\n{self.log()}")
            try:
                return bool(condition())
            except OSError:
                return False

        try:
            wait_for(holds, timeout, what)
        except AssertionError as e:
            if "timed out" in str(e):
                raise AssertionError(f"timed out waiting for {what}:\n{self.log()}") from None
            raise

    def wait_ready(self, timeout: float = 60.0) -> None:
        self.wait_until(lambda: self.get("/v2/health/ready")[0] == 200, timeout, "readiness")

    def wait_live(self, timeout: float = 60.0) -> None:
        self.wait_until(lambda: self.get("/v2/health/live")[0] == 200, timeout, "liveness")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.log_file.close()
        return self.proc.returncode

    def close(self) -> list[str]:
        """Stop the server gracefully and clean up after it; the shared-memory segments it left,
        as they were before the clean-up unlinked them (a test asserts there are none)."""
        self.stop()
        left = shm_segments(self.proc.pid)
        self.cleanup()
        return left

    def cleanup(self) -> None:
        """Kill whatever is left of the process group and unlink segments it left behind."""
        self.stop()
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        for path in shm_segments(self.proc.pid):
            os.unlink(path)


@pytest.fixture(scope="session")
def example_repo(tmp_path_factory) -> Path:
    """The example repository with its ONNX model built (as `make example-repo` does)."""
    import make_example_repo

    repo = tmp_path_factory.mktemp("example") / "model_repository"
    shutil.copytree(EXAMPLE_REPO, repo, ignore=shutil.ignore_patterns("*.onnx"))
    make_example_repo.main(str(repo))
    return repo


@pytest.fixture(scope="session")
def test_repo(tmp_path_factory) -> Path:
    repo = tmp_path_factory.mktemp("models") / "repo"
    # response_sender is served in its eight variants by response_sender_repo; llm (of the suite's
    # python-based backend) by test_llm_backend and the whole-server repository
    shutil.copytree(TEST_MODELS, repo, ignore=shutil.ignore_patterns("response_sender", "llm"))
    return repo


# doubles X and says which numpy it runs with
NUMPY_REPORTER = """import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            version = np.full((x.shape[0], 1), np.__version__.encode(), dtype=np.object_)
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", x * 2),
                                                   pb_utils.Tensor("NUMPY", version)]))
        return out
"""


NUMPY_1 = "1.26.4"  # the numpy of the suite's environment that differs from the server's


def python_environment(numpy_version: str) -> Path:
    """A virtual environment of the server's Python with this numpy ("": none), built once with uv
    (of the test extra) and kept in the user's cache between runs."""
    import hashlib

    name = f"numpy-{numpy_version}" if numpy_version else "no-numpy"
    key = hashlib.sha256(f"{sys.version}{name}".encode()).hexdigest()[:12]
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "tritonmp-test-envs"
    env = cache / f"{name}-{key}"
    if (env / ".complete").exists():
        return env
    uv = os.path.join(os.path.dirname(sys.executable), "uv")
    shutil.rmtree(env, ignore_errors=True)
    subprocess.run([uv, "venv", "-q", "--python", sys.executable, str(env)], check=True)
    if numpy_version:
        subprocess.run([uv, "pip", "install", "-q", "--python", str(env / "bin" / "python"),
                        f"numpy=={numpy_version}"], check=True)
    (env / ".complete").touch()
    return env


@pytest.fixture
def start_server(tmp_path):
    """Start servers for one test; each is stopped and cleaned up when the test ends."""
    servers: list[ServerProcess] = []

    def start(repos, *args: str, wait: bool = True, env: dict[str, str] | None = None) -> ServerProcess:
        server = ServerProcess(list(repos), list(args), tmp_path / f"server{len(servers)}.log", env)
        servers.append(server)
        if wait:
            server.wait_ready()
        return server

    yield start
    left = {server.pid: server.close() for server in servers}
    assert not any(left.values()), f"shared memory left behind: {left}"


@contextlib.contextmanager
def serving(repos: list, args: list[str], tmp_path_factory, env: dict[str, str] | None = None
            ) -> Iterator[ServerProcess]:
    """A ready server for a module-scoped fixture; stopped, and checked to leave no shared memory."""
    s = ServerProcess(repos, args, tmp_path_factory.mktemp("log") / "server.log", env)
    try:
        s.wait_ready()
        yield s
    finally:
        left = s.close()
        assert not left, f"shared memory left behind: {left}"


@pytest.fixture(scope="module")
def server(example_repo, test_repo, tmp_path_factory):
    """One server on the example and test repositories, shared by a module's tests."""
    with serving([example_repo, test_repo], [], tmp_path_factory) as s:
        yield s
