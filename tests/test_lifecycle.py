"""The server's life: SIGTERM drains requests in flight and exits 0 leaving nothing behind, a second
signal stops at once, and systemd hears READY=1, WATCHDOG=1 and STOPPING=1 through NOTIFY_SOCKET.
(A crash-looping model is given up in test_whole_server.py; the restart policy's rules are in
test_policies.py.)"""

import signal
import socket
import threading
import time

import pytest
from test_queue_policy import Calls, _repo

from conftest import X_TO_Y_CONFIG, shm_segments, write_model


def test_sigterm_finishes_requests_in_flight_and_exits_0(start_server, tmp_path):
    server = start_server([_repo(tmp_path, "")])
    calls = Calls(server)
    calls.send("running", 1.0)
    calls.wait_queued(1, 0)
    calls.send("queued", 0.2)
    calls.wait_queued(1, 1)
    server.proc.send_signal(signal.SIGTERM)
    # readiness goes at once: a probe now is refused or answered "not ready"
    server.wait_until(lambda: _not_ready(server), timeout=5, what="readiness to drop")
    calls.join()
    assert isinstance(calls.results["running"], int) and isinstance(calls.results["queued"], int)
    assert server.proc.wait(30) == 0
    assert not shm_segments(server.pid)
    assert "received SIGTERM, shutting down" in server.log()


def _not_ready(server) -> bool:
    try:
        return server.get("/v2/health/ready")[0] != 200
    except OSError:
        return True


def test_second_signal_stops_at_once(start_server, tmp_path):
    server = start_server([_repo(tmp_path, "")], "--exit-timeout-secs", "60")
    calls = Calls(server)
    calls.send("long", 30.0)
    calls.wait_queued(1, 0)
    started = time.monotonic()
    server.proc.send_signal(signal.SIGTERM)
    server.wait_until(lambda: "shutting down" in server.log(), timeout=10, what="the first signal")
    server.proc.send_signal(signal.SIGTERM)
    server.proc.wait(20)
    assert time.monotonic() - started < 20
    assert not shm_segments(server.pid)
    assert "received SIGTERM again: stopping now" in server.log()
    calls.join()
    assert isinstance(calls.results["long"], Exception)


class NotifySocket:
    def __init__(self, path):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))
        self.sock.settimeout(0.2)
        self.messages: list[str] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._read)
        self.thread.start()

    def _read(self):
        while not self.stop.is_set():
            try:
                self.messages.append(self.sock.recv(4096).decode())
            except TimeoutError:
                continue

    def close(self):
        self.stop.set()
        self.thread.join()
        self.sock.close()


def test_systemd_notify_ready_watchdog_stopping(start_server, example_repo, tmp_path, monkeypatch):
    notify = NotifySocket(tmp_path / "notify.sock")
    monkeypatch.setenv("NOTIFY_SOCKET", str(tmp_path / "notify.sock"))
    monkeypatch.setenv("WATCHDOG_USEC", "400000")
    try:
        server = start_server([example_repo])
        server.wait_until(lambda: any("READY=1" in m for m in notify.messages), what="READY=1")
        server.wait_until(lambda: sum(m == "WATCHDOG=1" for m in notify.messages) >= 3, what="keep-alives")
        assert server.stop() == 0
        assert any(m.startswith("STOPPING=1") for m in notify.messages)
        ready_at = next(i for i, m in enumerate(notify.messages) if "READY=1" in m)
        assert "STATUS=serving" in notify.messages[ready_at]
    finally:
        notify.close()


def test_the_unit_file_runs_the_server_as_systemd_expects():
    from conftest import ROOT

    unit = (ROOT / "configs" / "tritonmp.service").read_text()
    for line in ("Type=notify", "WatchdogSec=", "NoNewPrivileges=yes", "ProtectSystem=strict", "PrivateTmp=yes",
                 "EnvironmentFile=", "KillSignal=SIGTERM"):
        assert line in unit, line
    assert "ExecStart=" in unit and "--model-repository" in unit
    assert "TRITONMP_ARGS" in (ROOT / "configs" / "tritonmp.env").read_text()


INIT_EXIT_PY = """
import os
import signal


class TritonPythonModel:
    def initialize(self, args):
        os.kill(os.getpid(), signal.SIGKILL)  # as the OOM killer would

    def execute(self, requests):
        return []
"""


@pytest.mark.parametrize("flags", [[], ["--disable-auto-complete-config"]], ids=["default", "no-auto-complete"])
def test_models_that_cannot_start_stop_the_server_in_tritons_words(tmp_path, flags):
    """Triton's qa/L0_backend_python start-up checks: a model whose process dies in initialize(), and one
    whose model.py is missing, keep the server from starting, with the words its qa greps the log for."""
    import subprocess

    from conftest import TRITONMP, free_ports

    cases = (("init_exit", INIT_EXIT_PY, "Stub process 'init_exit_0_0' is not healthy."),
             ("non_existent_model", None, None))
    for name, model_py, words in cases:
        repo = tmp_path / name
        model = write_model(repo, name, model_py or "", X_TO_Y_CONFIG + "instance_group [ { kind: KIND_CPU } ]\n")
        if model_py is None:
            (model / "1" / "model.py").unlink()
            words = f"Failed to preinitialize Python stub: Python model file not found in '{model / '1' / 'model.py'}'"
        ports = [f"--{p}-port={n}" for p, n in zip(("http", "grpc", "metrics"), free_ports(3))]
        result = subprocess.run([*TRITONMP, "--model-repository", str(repo), *ports, *flags],
                                capture_output=True, text=True, timeout=120)
        assert result.returncode == 1, result.stdout
        assert words in result.stdout + result.stderr and f"failed to load '{name}'" in result.stdout + result.stderr
