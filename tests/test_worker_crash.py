"""A worker that dies mid-request fails exactly its requests, is restarted, and nobody else notices;
no shared-memory segment survives the server, however it ends."""

import os
import re
import signal
import threading

import orjson

import procfs
from conftest import X_TO_Y_CONFIG, shm_segments, wait_for, write_model


def _x(value):
    return orjson.dumps({"inputs": [{"name": "X", "shape": [1], "datatype": "FP32", "data": [value]}]})


def _add(server):
    body = orjson.dumps({"inputs": [{"name": "A", "shape": [1, 3], "datatype": "FP32", "data": [1, 2, 3]},
                                    {"name": "B", "shape": [1, 3], "datatype": "FP32", "data": [4, 5, 6]}]})
    return server.post("/v2/models/add/infer", body)


def _worker_pids(server, instance):
    return [int(p) for p in re.findall(rf"worker {instance} of model '[^']+' version \d+ is ready \(pid (\d+)\)",
                                       server.log())]


def test_crash_fails_in_flight_request_and_the_instance_comes_back(start_server, example_repo, test_repo):
    server = start_server([example_repo, test_repo])
    first_pid = _worker_pids(server, "crash_0")[-1]
    stop, failures = threading.Event(), []

    def other_models():
        while not stop.is_set():
            status, _, raw = _add(server)
            if status != 200:
                failures.append(raw)

    thread = threading.Thread(target=other_models)
    thread.start()
    try:
        status, _, raw = server.post("/v2/models/crash/infer", _x(-1))
        assert status == 500
        error = orjson.loads(raw)["error"]
        assert "model 'crash' instance 'crash_0'" in error
        assert f"(pid {first_pid}) was killed by SIGKILL while running this request" in error
        # the next request waits for the instance to restart (until then the model is not ready, as
        # in Triton: test_model_readiness), and then the model is ready again
        status, _, raw = server.post("/v2/models/crash/infer", _x(7))
        assert status == 200, raw
        assert orjson.loads(raw)["outputs"][0]["data"] == [7.0]
        assert server.get("/v2/models/crash/ready")[0] == 200
    finally:
        stop.set()
        thread.join()
    assert not failures, failures[:3]
    new_pid = _worker_pids(server, "crash_0")[-1]
    assert new_pid != first_pid
    assert not procfs.alive(first_pid)
    restart = f"crash_0 of model 'crash' version 1 (pid {first_pid}) was killed by SIGKILL; restarting it"
    assert restart in server.log()


def test_clean_stop_leaves_no_segment_and_no_worker(start_server, example_repo, test_repo):
    server = start_server([example_repo, test_repo])
    workers = _worker_pids(server, r"\S+")
    assert workers
    assert server.stop(signal.SIGTERM) == 0
    assert not shm_segments(server.pid)
    for pid in workers:
        assert not os.path.exists(f"/proc/{pid}")


def test_killed_frontend_leaves_no_segment_and_its_workers_die(start_server, example_repo, test_repo):
    server = start_server([example_repo, test_repo])
    workers = _worker_pids(server, r"\S+")
    # traffic first, with a tensor large enough to go through the arenas
    big = orjson.dumps({"inputs": [{"name": "X", "shape": [1, 50_000], "datatype": "FP32",
                                    "data": [1.0] * 50_000}]})
    assert server.post("/v2/models/batch_report/infer", big)[0] == 200
    server.proc.kill()
    server.proc.wait()
    assert not shm_segments(server.pid)
    for pid in workers:  # PR_SET_PDEATHSIG takes them down with the frontend
        _wait_gone(pid)


def _wait_gone(pid, timeout=10.0):
    def gone() -> bool:
        return not procfs.alive(pid)

    wait_for(gone, timeout, f"worker {pid} to die with its frontend")


BROKEN_ON_RESTART = '''
import os
import signal

import triton_python_backend_utils as pb_utils

MARK = os.path.join(os.path.dirname(__file__), "crashed")


class TritonPythonModel:
    def initialize(self, args):
        if os.path.exists(MARK):
            raise RuntimeError("cannot start again after a crash")

    def execute(self, requests):
        open(MARK, "w").close()
        os.kill(os.getpid(), signal.SIGKILL)
'''


def test_queued_requests_fail_when_the_instance_cannot_come_back(start_server, tmp_path):
    write_model(tmp_path / "repo", "fragile", BROKEN_ON_RESTART, X_TO_Y_CONFIG)
    server = start_server([tmp_path / "repo"])
    status, _, raw = server.post("/v2/models/fragile/infer", _x(1))
    assert status == 500 and "was killed by SIGKILL" in orjson.loads(raw)["error"]
    status, _, raw = server.post("/v2/models/fragile/infer", _x(1))
    assert status == 503
    error = orjson.loads(raw)["error"]
    assert "model 'fragile' version 1 has no live instance" in error
    assert "cannot start again after a crash" in error


def test_hung_model_is_killed_by_the_watchdog_and_restarted(start_server, tmp_path):
    from test_queue_policy import Calls, _repo

    repo = _repo(tmp_path, "")
    config = repo / "sleepy" / "config.pbtxt"
    limit = 'parameters { key: "execution_timeout_secs" value: { string_value: "0.5" } }\n'
    config.write_text(config.read_text() + limit)
    server = start_server([repo])
    calls = Calls(server)
    calls.send("hung", 30.0)
    calls.join()
    error = calls.results["hung"]
    assert isinstance(error, Exception)
    assert "did not finish a batch within 0.5s (--execution-timeout-secs) and was killed" in str(error)
    calls = Calls(server)
    calls.send("next", 0.0)  # served by the restarted worker
    calls.join()
    assert isinstance(calls.results["next"], int)


def test_a_model_stuck_in_initialize_fails_its_load(start_server, tmp_path):
    write_model(tmp_path / "repo", "stuck", "import threading\n\n\nclass TritonPythonModel:\n"
                "    def initialize(self, args):\n        threading.Event().wait()\n", X_TO_Y_CONFIG)
    server = start_server([tmp_path / "repo"], "--model-load-timeout-secs", "1", wait=False)
    assert server.proc.wait(60) == 1
    assert "instance 'stuck_0' did not finish loading within 1s (--model-load-timeout-secs)" in server.log()
