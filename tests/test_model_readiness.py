"""Model readiness as current Triton answers it: every instance's worker must be running, and a
python model's own is_ready() (plain or a coroutine) must say True, answered while the model
executes, within five seconds; an exception or an answer that is not a bool is "not ready". The
server's strict readiness asks the same of every model."""

import os
import re
import signal
import threading
import time

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from conftest import X_TO_Y_CONFIG, ServerProcess, serving, wait_for, write_model

READINESS_MODEL = """
import asyncio
import json
import os
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        params = json.loads(args["model_config"]).get("parameters", {})
        self.answer = params.get("ANSWER", {}).get("string_value", "true")
        self.delay = float(params.get("DELAY", {}).get("string_value", "0"))
        self.marker = params.get("MARKER", {}).get("string_value", "")

    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            if self.marker:  # X seconds of work, with a file that says it has begun
                open(self.marker, "w").close()
                time.sleep(float(x[0]))
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", x)]))
        return responses

    def is_ready(self):
        if self.answer == "coroutine":
            return self._is_ready_later()
        time.sleep(self.delay)
        if self.answer == "exception":
            raise RuntimeError("the model's own check failed")
        if self.answer == "not_bool":
            return "ready"
        return self.answer == "true"

    async def _is_ready_later(self):
        await asyncio.sleep(self.delay)
        return True
"""

# a model whose instance, restarted, does not finish loading while the gate file exists
GATED_MODEL = """
import json
import os
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        gate = json.loads(args["model_config"])["parameters"]["GATE"]["string_value"]
        while os.path.exists(gate):
            time.sleep(0.05)

    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.get_input_tensor_by_name(r, "X")]) for r in requests]
"""


def _config(**params: str) -> str:
    return X_TO_Y_CONFIG + "".join(f'parameters {{ key: "{k}" value {{ string_value: "{v}" }} }}\n'
                                   for k, v in params.items())


@pytest.fixture(scope="module")
def readiness(tmp_path_factory):
    repo = tmp_path_factory.mktemp("readiness") / "repo"
    marker = repo.parent / "executing"
    for name, answer, delay in (("says_yes", "true", "0.1"), ("says_no", "false", "0.1"),
                                ("raises", "exception", "0.1"), ("not_bool", "not_bool", "0.1"),
                                ("coroutine", "coroutine", "0.1"), ("slow", "true", "5.6")):
        write_model(repo, name, READINESS_MODEL, _config(ANSWER=answer, DELAY=delay))
    write_model(repo, "busy", READINESS_MODEL, _config(ANSWER="true", MARKER=str(marker)))
    write_model(repo, "plain", READINESS_MODEL.replace("def is_ready", "def _unused"), _config())
    with serving([repo], ["--strict-readiness=false", "--log-verbose=1"], tmp_path_factory) as server:
        server.marker = marker
        yield server


def _ready(server, model: str) -> tuple[bool, bool]:
    """The model's readiness over HTTP and over gRPC."""
    with httpclient.InferenceServerClient(server.url) as http, \
            grpcclient.InferenceServerClient(server.grpc_url) as grpc:
        return http.is_model_ready(model), grpc.is_model_ready(model)


def _infer(server, model: str, x: float = 1.0) -> float:
    with httpclient.InferenceServerClient(server.url, network_timeout=60) as client:
        tensor = httpclient.InferInput("X", [1], "FP32")
        tensor.set_data_from_numpy(np.array([x], np.float32))
        return float(client.infer(model, [tensor]).as_numpy("Y")[0])


@pytest.mark.parametrize("model,ready", [("says_yes", True), ("coroutine", True), ("plain", True),
                                         ("says_no", False), ("raises", False), ("not_bool", False)])
def test_the_models_own_answer_is_its_readiness_and_inference_goes_on(readiness, model, ready):
    for _ in range(3):
        assert _ready(readiness, model) == (ready, ready)
        assert _infer(readiness, model, 4.0) == 4.0  # a model that says no still serves, as in Triton


def test_why_a_model_is_not_ready_is_logged_in_tritons_words(readiness):
    for model in ("says_no", "raises", "not_bool"):
        _ready(readiness, model)
    log = readiness.log()
    assert "Model 'says_no' version 1 is not ready: Model 'says_no_0' is not ready (user-defined check failed)." in log
    assert "Model 'raises' version 1 is not ready: RuntimeError: the model's own check failed" in log
    assert "Model 'not_bool' version 1 is not ready: is_ready() must return a boolean value" in log


def test_is_ready_is_answered_while_the_model_executes(readiness):
    readiness.marker.unlink(missing_ok=True)
    answered = []
    work = threading.Thread(target=lambda: answered.append(_infer(readiness, "busy", 4.0)))
    work.start()
    try:
        wait_for(readiness.marker.exists, 30, "the model to begin executing")
        started = time.monotonic()
        assert _ready(readiness, "busy") == (True, True)
        assert time.monotonic() - started < 3.0 and not answered, "readiness waited for the batch to finish"
    finally:
        work.join()
    assert answered == [4.0]


@pytest.mark.slow
def test_a_check_that_takes_too_long_is_not_ready_and_the_next_caller_shares_its_answer(readiness):
    with httpclient.InferenceServerClient(readiness.url) as http, \
            grpcclient.InferenceServerClient(readiness.grpc_url) as grpc:
        started = time.monotonic()
        assert not http.is_model_ready("slow")  # is_ready() takes 5.6 s: not ready after 5
        assert 4.5 < time.monotonic() - started < 6.5
        assert _infer(readiness, "slow") == 1.0  # inference is not held up meanwhile
        assert grpc.is_model_ready("slow")  # waits for the check in flight, which says yes after 5.6 s
        assert time.monotonic() - started < 9.0
    assert "Model 'slow' version 1 is not ready: Timed out waiting for user-defined is_ready() response" \
        in readiness.log()


def test_concurrent_readiness_checks_and_inferences(readiness):
    results, errors = [], []

    def check():
        try:
            results.append(_ready(readiness, "says_yes"))
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    def infer():
        try:
            results.append(_infer(readiness, "says_yes", 2.0))
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=fn) for _ in range(8) for fn in (check, infer)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert sorted(results, key=str) == sorted([(True, True)] * 8 + [2.0] * 8, key=str)


def test_a_model_whose_worker_died_is_not_ready_until_it_is_back(tmp_path, tmp_path_factory):
    repo, gate = tmp_path / "repo", tmp_path / "gate"
    write_model(repo, "gated", GATED_MODEL, _config(GATE=str(gate)))
    with serving([repo], ["--log-verbose=1"], tmp_path_factory) as server:
        pid = int(re.findall(r"worker gated_0 of model 'gated' version 1 is ready \(pid (\d+)\)", server.log())[-1])
        gate.touch()  # its restart waits for the gate
        os.kill(pid, signal.SIGKILL)
        server.wait_until(lambda: _ready(server, "gated") == (False, False), 30, "the model to be not ready")
        assert server.get("/v2/health/ready")[0] == 400  # strict readiness asks every model
        assert server.log().count("Model 'gated' version 1 is not ready: Stub process 'gated_0' is not healthy.") >= 2
        gate.unlink()
        server.wait_until(lambda: _ready(server, "gated") == (True, True), 30, "the model to be ready again")
        assert server.get("/v2/health/ready")[0] == 200


def test_strict_readiness_asks_every_models_own_check(tmp_path):
    repo = tmp_path / "repo"
    write_model(repo, "says_no", READINESS_MODEL, _config(ANSWER="false"))
    write_model(repo, "says_yes", READINESS_MODEL, _config(ANSWER="true"))
    server = ServerProcess([repo], ["--log-verbose=1"], tmp_path / "server.log")
    why = ("failed runtime readiness check during server readiness evaluation: Model 'says_no_0' is not ready "
           "(user-defined check failed).")
    try:
        server.wait_until(lambda: server.get("/v2/health/ready")[0] == 400 and why in server.log(), 60,
                          "the server to say why it is not ready")
        assert _ready(server, "says_yes") == (True, True)
        assert server.get("/v2/health/ready")[0] == 400
    finally:
        left = server.close()
        assert not left, f"shared memory left behind: {left}"
