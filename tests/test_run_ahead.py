"""A batch sent to a busy instance ahead of time (Instance.run_ahead): while a worker runs one batch,
the scheduler may send it the next one when that batch can no longer change. Each request still
gets its own answer, large inputs and outputs of the two batches in flight do not overwrite one
another (each has its own input and output arena), and a worker that dies with a batch waiting
fails that batch's requests too, with words that say so.

The models here wait at a gate, a FIFO the test writes one byte to for each batch it lets go, so
that which batch runs while which one waits is the test's choice, not the clock's."""

import os
import threading

import numpy as np
import orjson
import pytest

from conftest import write_model

GATE_PY = """
import os
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.gate = os.open(os.path.join(os.path.dirname(__file__), "gate"), os.O_RDONLY)
        self.every = args["model_name"] == "double_slow"  # double_fast waits at every other batch only
        self.batches = 0

    def execute(self, requests):
        self.batches += 1
        if self.every or self.batches % 2:
            os.read(self.gate, 1)  # until the test lets this batch go
        xs = [pb_utils.get_input_tensor_by_name(r, "X").as_numpy() for r in requests]  # views, not copies
        return [pb_utils.InferenceResponse([pb_utils.Tensor("Y", x * 2)]) for x in xs]
"""

BATCHED_CONFIG = ('backend: "python"\nmax_batch_size: 4\n'
                  'input [ { name: "X", data_type: TYPE_FP32, dims: [ -1 ] } ]\n'
                  'output [ { name: "Y", data_type: TYPE_FP32, dims: [ -1 ] } ]\n'
                  'dynamic_batching { max_queue_delay_microseconds: 60000000 }\n')  # batches of exactly 4

WIDE = 20000  # elements: FP32 bytes past what travels inline (arenas), in a JSON body short enough for
# the HTTP fast path, whose requests are the ones sent ahead (they cannot be cancelled)
GROUPS = 8  # batches of 4 requests each


def _gated_model(repo, name: str, model_py: str, config: str) -> int:
    """Write the model with its gate; the test's end of the gate (held open for writing)."""
    version = write_model(repo, name, model_py, config) / "1"
    os.mkfifo(version / "gate")
    return os.open(version / "gate", os.O_RDWR)  # open without waiting for the model's end


def _infer(server, model: str, x: list) -> list:
    body = orjson.dumps({"inputs": [{"name": "X", "shape": [1, len(x)], "datatype": "FP32", "data": x}]})
    status, _, raw = server.post(f"/v2/models/{model}/infer", body)
    assert status == 200, raw
    return orjson.loads(raw)["outputs"][0]["data"]


@pytest.mark.parametrize("model", ["double_slow", "double_fast"])
def test_batches_sent_ahead_answer_every_request_with_its_own_data(start_server, tmp_path, model):
    """double_slow reads its inputs only once let go, after the next batch was sent ahead (which
    must not overwrite them). double_fast waits at every other batch: the batch sent ahead behind
    one then runs at once and writes its outputs while the frontend may not have read those of the
    batch before yet (they must go to another arena)."""
    repo = tmp_path / "repo"
    gate = _gated_model(repo, model, GATE_PY, BATCHED_CONFIG)
    server = start_server([repo], "--log-verbose", "1")
    every = model == "double_slow"
    wrong: list = []
    threads = []

    def one(group: int, i: int) -> None:
        x = np.random.default_rng(group * 4 + i).integers(0, 10, WIDE).tolist()
        try:
            if _infer(server, model, x) != [2 * v for v in x]:
                wrong.append(f"batch {group} request {i}: wrong answer")
        except Exception as e:  # a failed request fails the test, not only its thread
            wrong.append(f"batch {group} request {i}: {e!r}")

    try:
        for group in range(1, GROUPS + 1):
            for i in range(4):
                threads.append(threading.Thread(target=one, args=(group, i)))
                threads[-1].start()
            line = f"batch {group} of 4 request(s) "
            server.wait_until(lambda line=line: line in server.log(), 30, f"batch {group}")
            if group > 1 and (every or (group - 1) % 2):  # the batch before it waits at the gate
                sent = [text for text in server.log().splitlines() if line in text]
                assert f"sent ahead to instance '{model}_0'" in sent[0], sent
                os.write(gate, b"x")  # the batch before it goes on, with this one waiting behind it
        if every or GROUPS % 2:
            os.write(gate, b"x")
        for t in threads:
            t.join(60)
    finally:
        os.write(gate, b"x" * GROUPS)  # whatever still waits at the gate goes, so that the server can stop
        os.close(gate)
    assert not wrong, wrong[:5]
    log = server.log()
    assert "sent ahead to instance" in log, "no batch was sent ahead: the test proves nothing"
    stats = orjson.loads(server.get(f"/v2/models/{model}/stats")[2])["model_stats"][0]
    assert stats["inference_count"] == GROUPS * 4
    assert stats["inference_stats"]["success"]["count"] == GROUPS * 4


CRASH_PY = """
import os
import signal
import triton_python_backend_utils as pb_utils

HERE = os.path.dirname(__file__)


class TritonPythonModel:
    def initialize(self, args):
        self.gate = os.open(os.path.join(HERE, "gate"), os.O_RDONLY)

    def execute(self, requests):
        xs = [pb_utils.get_input_tensor_by_name(r, "X").as_numpy() for r in requests]
        if any((x == -1).any() for x in xs):
            open(os.path.join(HERE, "running"), "w").close()
            os.read(self.gate, 1)  # until the test lets it die
            os.kill(os.getpid(), signal.SIGKILL)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("Y", x)]) for x in xs]
"""

CRASH_CONFIG = ('backend: "python"\nmax_batch_size: 2\n'
                'input [ { name: "X", data_type: TYPE_FP32, dims: [ 1 ] } ]\n'
                'output [ { name: "Y", data_type: TYPE_FP32, dims: [ 1 ] } ]\n'
                'dynamic_batching { max_queue_delay_microseconds: 0 }\n')


def _x(value: float) -> bytes:
    return orjson.dumps({"inputs": [{"name": "X", "shape": [1, 1], "datatype": "FP32", "data": [value]}]})


def test_a_worker_that_dies_fails_the_batch_sent_ahead_and_the_queue_runs_on(start_server, tmp_path):
    repo = tmp_path / "repo"
    gate = _gated_model(repo, "crash2", CRASH_PY, CRASH_CONFIG)
    version = repo / "crash2" / "1"
    server = start_server([repo], "--log-verbose", "1")
    answers: dict = {}

    def post(key, value):
        status, _, raw = server.post("/v2/models/crash2/infer", _x(value))
        answers[key] = (status, orjson.loads(raw))

    threads = [threading.Thread(target=post, args=("crash", -1))]
    threads[0].start()
    server.wait_until(lambda: (version / "running").exists(), 30, "the first batch to run")
    # four more while it runs: the first full batch is sent ahead; the other two, whether they come
    # before the worker dies or after, are served by its next incarnation
    for i in range(4):
        threads.append(threading.Thread(target=post, args=(i, i + 1)))
        threads[-1].start()
    server.wait_until(lambda: "sent ahead to instance 'crash2_0'" in server.log(), 30, "a batch sent ahead")
    os.write(gate, b"x")
    for t in threads:
        t.join(60)
    assert len(answers) == 5, answers

    status, body = answers["crash"]
    assert status == 500 and "was killed by SIGKILL while running this request" in body["error"], body
    failed = {k: v for k, v in answers.items() if k != "crash" and v[0] != 200}
    served = {k: v for k, v in answers.items() if k != "crash" and v[0] == 200}
    assert len(failed) == 2 and len(served) == 2, answers
    for status, body in failed.values():
        assert status == 500
        assert "was killed by SIGKILL before it could run this request" in body["error"], body
    for key, (_, body) in served.items():
        assert body["outputs"][0]["data"] == [key + 1]
    # the restarted instance serves on
    os.unlink(version / "running")
    status, _, raw = server.post("/v2/models/crash2/infer", _x(5))
    assert status == 200 and orjson.loads(raw)["outputs"][0]["data"] == [5.0], raw
    os.close(gate)  # after the restarted instance has opened its end
