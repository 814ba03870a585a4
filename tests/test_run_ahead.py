"""A batch sent to a busy instance ahead of time (Instance.run_ahead): while a worker runs one batch,
the scheduler may send it the next one when that batch can no longer change. Each request still
gets its own answer, large inputs and outputs of the two batches in flight do not overwrite one
another (each has its own input and output arena), and a worker that dies with a batch waiting
fails that batch's requests too, with words that say so."""

import os
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import orjson
import pytest

from conftest import write_model

DOUBLE_PY = """
import time
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.slow = args["model_name"] == "double_slow"
        self.batches = 0

    def execute(self, requests):
        xs = [pb_utils.get_input_tensor_by_name(r, "X").as_numpy() for r in requests]  # views, not copies
        self.batches += 1
        if self.slow or self.batches % 2:
            time.sleep(0.02)  # the queue fills meanwhile, and batches are sent ahead
        return [pb_utils.InferenceResponse([pb_utils.Tensor("Y", x * 2)]) for x in xs]
"""

BATCHED_CONFIG = ('backend: "python"\nmax_batch_size: 4\n'
                  'input [ { name: "X", data_type: TYPE_FP32, dims: [ -1 ] } ]\n'
                  'output [ { name: "Y", data_type: TYPE_FP32, dims: [ -1 ] } ]\n'
                  'dynamic_batching { max_queue_delay_microseconds: 0 }\n')

WIDE = 20000  # elements: FP32 bytes past what travels inline (arenas), in a JSON body short enough for
# the HTTP fast path, whose requests are the ones sent ahead (they cannot be cancelled)


def _infer(server, model: str, x: list) -> list:
    body = orjson.dumps({"inputs": [{"name": "X", "shape": [1, len(x)], "datatype": "FP32", "data": x}]})
    status, _, raw = server.post(f"/v2/models/{model}/infer", body)
    assert status == 200, raw
    return orjson.loads(raw)["outputs"][0]["data"]


@pytest.mark.parametrize("model", ["double_slow", "double_fast"])
def test_batches_sent_ahead_answer_every_request_with_its_own_data(start_server, tmp_path, model):
    """double_slow reads its inputs long after its batch started (a batch sent ahead meanwhile must
    not overwrite them). double_fast is slow every other batch: the batch sent ahead then runs at
    once and writes its outputs before the frontend has read those of the batch before (they must
    go to another arena)."""
    repo = tmp_path / "repo"
    write_model(repo, model, DOUBLE_PY, BATCHED_CONFIG)
    server = start_server([repo], "--log-verbose", "1")

    def one_client(seed: int, mixed: bool) -> list[str]:
        wrong = []
        rng = np.random.default_rng(seed)
        for i in range(10):
            n = 3 if mixed and (seed + i) % 3 else WIDE  # mixed sizes: a batch ends where the shape changes
            x = rng.integers(0, 10, n).tolist()
            if _infer(server, model, x) != [2 * v for v in x]:
                wrong.append(f"client {seed} request {i} ({n} elements)")
        return wrong

    wrong = []
    for mixed in (False, True):
        with ThreadPoolExecutor(16) as pool:
            wrong += [w for ws in pool.map(one_client, range(16), [mixed] * 16) for w in ws]
    assert not wrong, wrong[:5]
    assert f"sent ahead to instance '{model}_0'" in server.log(), "no batch was sent ahead: the test proves nothing"
    stats = orjson.loads(server.get(f"/v2/models/{model}/stats")[2])["model_stats"][0]
    assert stats["inference_count"] == 2 * 16 * 10
    assert stats["inference_stats"]["success"]["count"] == 2 * 16 * 10


CRASH_PY = """
import os
import signal
import time
import triton_python_backend_utils as pb_utils

HERE = os.path.dirname(__file__)


class TritonPythonModel:
    def execute(self, requests):
        xs = [pb_utils.get_input_tensor_by_name(r, "X").as_numpy() for r in requests]
        if any((x == -1).any() for x in xs):
            open(os.path.join(HERE, "running"), "w").close()
            deadline = time.monotonic() + 60
            while not os.path.exists(os.path.join(HERE, "go")) and time.monotonic() < deadline:
                time.sleep(0.01)
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
    model = write_model(repo, "crash2", CRASH_PY, CRASH_CONFIG)
    version = model / "1"
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
    (version / "go").touch()
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
