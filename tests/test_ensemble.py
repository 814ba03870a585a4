"""Ensembles: steps chained and run side by side in the frontend, composing models loaded first,
configs checked, unload_dependents."""

import os
import shutil
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from conftest import write_model

SCALE = '''
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "X").as_numpy()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", x * 10)]))
        return responses
'''

PIPELINE = '''
name: "pipeline"
platform: "ensemble"
max_batch_size: 8
input [ { name: "IN_A", data_type: TYPE_FP32, dims: [ 3 ] }, { name: "IN_B", data_type: TYPE_FP32, dims: [ 3 ] } ]
output [ { name: "SCALED", data_type: TYPE_FP32, dims: [ 3 ] }, { name: "SUM", data_type: TYPE_FP32, dims: [ 3 ] },
         { name: "A_SCALED", data_type: TYPE_FP32, dims: [ 3 ] } ]
ensemble_scheduling {
  step [
    { model_name: "add", model_version: -1, input_map { key: "A" value: "IN_A" }
      input_map { key: "B" value: "IN_B" } output_map { key: "C" value: "SUM" } },
    { model_name: "scale", model_version: -1, input_map { key: "X" value: "SUM" }
      output_map { key: "Y" value: "SCALED" } },
    { model_name: "scale", model_version: 1, input_map { key: "X" value: "IN_A" }
      output_map { key: "Y" value: "A_SCALED" } }
  ]
}
'''


@pytest.fixture
def repo(tmp_path, example_repo):
    root = tmp_path / "repo"
    shutil.copytree(example_repo / "add", root / "add")
    write_model(root, "scale", SCALE,
        'backend: "python"\nmax_batch_size: 8\ninput [ { name: "X", data_type: TYPE_FP32, dims: [ 3 ] } ]\n'
        'output [ { name: "Y", data_type: TYPE_FP32, dims: [ 3 ] } ]\n')
    (root / "pipeline" / "1").mkdir(parents=True)
    (root / "pipeline" / "config.pbtxt").write_text(PIPELINE)
    return root


def _inputs(module, a, b):
    inputs = [module.InferInput("IN_A", list(a.shape), "FP32"), module.InferInput("IN_B", list(b.shape), "FP32")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    return inputs


@pytest.mark.parametrize("module", [httpclient, grpcclient], ids=["http", "grpc"])
def test_ensemble_chains_and_parallel_steps(start_server, repo, module):
    server = start_server([repo])
    client = module.InferenceServerClient(server.url if module is httpclient else server.grpc_url)
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    b = np.ones((2, 3), np.float32)
    result = client.infer("pipeline", _inputs(module, a, b))
    np.testing.assert_array_equal(result.as_numpy("SUM"), a + b)
    np.testing.assert_array_equal(result.as_numpy("SCALED"), (a + b) * 10)
    np.testing.assert_array_equal(result.as_numpy("A_SCALED"), a * 10)
    only = client.infer("pipeline", _inputs(module, a, b), outputs=[module.InferRequestedOutput("SCALED")])
    assert only.as_numpy("SUM") is None
    meta = httpclient.InferenceServerClient(server.url).get_model_metadata("pipeline")
    assert meta["platform"] == "ensemble"
    stats = httpclient.InferenceServerClient(server.url).get_inference_statistics("pipeline")["model_stats"][0]
    assert stats["inference_count"] == 4  # two requests of batch 2


def test_step_errors_reach_the_client(start_server, repo):
    server = start_server([repo])
    client = httpclient.InferenceServerClient(server.url)
    bad = np.ones((9, 3), np.float32)  # over max_batch_size of the ensemble
    with pytest.raises(InferenceServerException, match="batch-size must be <= 8 for 'pipeline'"):
        client.infer("pipeline", _inputs(httpclient, bad, bad))


@pytest.mark.parametrize("module", [httpclient, grpcclient], ids=["http", "grpc"])
def test_explicit_load_of_an_ensemble_loads_its_models_and_unload_dependents(start_server, repo, module):
    server = start_server([repo], "--model-control-mode=explicit")
    client = module.InferenceServerClient(server.url if module is httpclient else server.grpc_url)

    def ready() -> set:
        return {m for m in ("add", "scale", "pipeline") if client.is_model_ready(m)}

    client.load_model("pipeline")
    assert ready() == {"add", "scale", "pipeline"}
    client.unload_model("pipeline")  # its models stay
    assert ready() == {"add", "scale"}
    client.load_model("pipeline")
    client.unload_model("pipeline", unload_dependents=True)  # its models go with it
    assert ready() == set()
    client.load_model("pipeline")
    client.unload_model("scale")  # an ensemble cannot run without its models: it goes too
    assert ready() == {"add"}


def test_ensemble_config_problems(repo):
    from test_config import _check

    text = PIPELINE.replace('output_map { key: "C" value: "SUM" }', 'output_map { key: "C" value: "TOTAL" }')
    (repo / "pipeline" / "config.pbtxt").write_text(text)
    out = _check(repo).stdout
    assert "ensemble_scheduling.step[1].input_map: ensemble tensor(s) SUM are neither ensemble inputs nor " \
           "produced by another step" in out
    assert "output: ensemble output 'SUM' is produced by no step" in out


def test_check_follows_ensemble_steps_to_their_models(repo):
    from test_config import _check

    text = PIPELINE.replace('model_name: "scale", model_version: -1', 'model_name: "missing", model_version: -1')
    text = text.replace('input_map { key: "B" value: "IN_B" }', 'input_map { key: "Q" value: "IN_B" }')
    (repo / "pipeline" / "config.pbtxt").write_text(text)
    out = _check(repo).stdout
    assert "ensemble_scheduling.step[1].model_name: no model 'missing' in the repositories" in out
    assert "ensemble_scheduling.step[0].input_map: 'Q' is not an input of 'add' (it has A, B)" in out


def test_ensemble_outputs_cannot_go_to_client_shared_memory(start_server, repo):
    import orjson
    import tritonclient.utils.shared_memory as shm

    server = start_server([repo], "--allow-client-shm=true")
    handle = shm.create_shared_memory_region("ens_out", "/tritonmp-test-ens-out", 64)
    try:
        httpclient.InferenceServerClient(server.url).register_system_shared_memory(
            "ens_out", "/tritonmp-test-ens-out", 64)
        body = orjson.dumps({"inputs": [{"name": n, "shape": [1, 3], "datatype": "FP32", "data": [1, 2, 3]}
                                        for n in ("IN_A", "IN_B")],
                             "outputs": [{"name": "SUM", "parameters": {"shared_memory_region": "ens_out",
                                                                        "shared_memory_byte_size": 12}}]})
        status, _, raw = server.post("/v2/models/pipeline/infer", body)
        assert status == 501
        assert "an ensemble cannot write its outputs into client shared memory" in orjson.loads(raw)["error"]
    finally:
        shm.destroy_shared_memory_region(handle)


SLOW = '''
import os
import sys

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        print("slow: executing", file=sys.stderr, flush=True)
        with open(os.path.join(os.path.dirname(__file__), "..", "release")) as fifo:
            fifo.read()  # until the test lets it go
        return [pb_utils.InferenceResponse([pb_utils.Tensor("Y", pb_utils.get_input_tensor_by_name(r, "X")
                                                            .as_numpy())]) for r in requests]
'''


def _release(fifo) -> None:
    """Let a model blocked on the FIFO return (nothing happens when none waits on it)."""
    try:
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
    except OSError:  # no reader
        pass

SLOW_PIPELINE = '''
name: "slowpipe"
platform: "ensemble"
max_batch_size: 8
input [ { name: "IN", data_type: TYPE_FP32, dims: [ 3 ] } ]
output [ { name: "OUT", data_type: TYPE_FP32, dims: [ 3 ] } ]
ensemble_scheduling {
  step [ { model_name: "slow", model_version: -1, input_map { key: "X" value: "IN" }
           output_map { key: "Y" value: "OUT" } } ]
}
'''


def test_an_ensemble_stopped_under_its_requests_answers_them_unavailable(start_server, tmp_path):
    """Unloaded while requests run, past the exit timeout: each client gets UNAVAILABLE with the
    reason, over HTTP and gRPC alike, instead of a call left unanswered."""
    root = tmp_path / "repo"
    write_model(root, "slow", SLOW,
                'backend: "python"\nmax_batch_size: 8\ninput [ { name: "X", data_type: TYPE_FP32, dims: [ 3 ] } ]\n'
                'output [ { name: "Y", data_type: TYPE_FP32, dims: [ 3 ] } ]\n'
                'instance_group [ { count: 2, kind: KIND_CPU } ]\n')  # both requests run at once
    (root / "slowpipe" / "1").mkdir(parents=True)
    (root / "slowpipe" / "config.pbtxt").write_text(SLOW_PIPELINE)
    fifo = root / "slow" / "release"
    os.mkfifo(fifo)
    server = start_server([root], "--exit-timeout-secs", "1", "--model-control-mode=explicit", "--load-model=slowpipe")
    x = np.ones((1, 3), np.float32)
    outcomes = {}

    def call(module, url):
        client = module.InferenceServerClient(url)
        inp = module.InferInput("IN", [1, 3], "FP32")
        inp.set_data_from_numpy(x)
        kwargs = {"client_timeout": 20} if module is grpcclient else {}
        try:
            client.infer("slowpipe", [inp], **kwargs)
            outcomes[module.__name__] = "answered"
        except InferenceServerException as e:
            outcomes[module.__name__] = f"{e.status()} {e.message()}"

    try:
        with ThreadPoolExecutor(2) as pool:
            pool.submit(call, httpclient, server.url)
            pool.submit(call, grpcclient, server.grpc_url)
            server.wait_until(lambda: server.log().count("slow: executing") >= 2, 30,
                              "both requests to reach the model")
            status, _, _ = server.post("/v2/repository/models/slowpipe/unload", b"{}")
            assert status == 200
    finally:
        _release(fifo)
    assert outcomes["tritonclient.http"].startswith("503") \
        and "ensemble 'slowpipe' is unloading" in outcomes["tritonclient.http"], outcomes
    assert outcomes["tritonclient.grpc"].startswith("StatusCode.UNAVAILABLE") \
        and "ensemble 'slowpipe' is unloading" in outcomes["tritonclient.grpc"], outcomes
