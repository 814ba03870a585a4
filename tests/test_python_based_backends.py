"""Python-based backends (--backend-directory): a backend written in Python is DIR/<name>/model.py, and
every model whose config says `backend: "<name>"` runs that file on the python backend, with its own
files (model.json) in its version directory (`pb_utils.get_model_dir()`, `args["model_repository"]`,
`args["model_version"]`). Triton's rules for which file wins and its words where none does; the
config's `runtime`; auto-complete, decoupled models and custom metrics in such a model; and Triton's
qa/L0_backend_python/python_based_backends expectations (models loaded explicitly, one with a
version policy given in the load's config)."""

from __future__ import annotations

import json

import numpy as np
import orjson
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from conftest import http_request, scrape_metrics

# the shared code of the add_sub backend: auto-completes its tensors, reads its model's model.json
ADD_SUB = '''
import json, os
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    @staticmethod
    def auto_complete_config(config):
        have = {t["name"] for t in config.as_dict()["input"]}
        for name in ("INPUT0", "INPUT1"):
            if name not in have:
                config.add_input({"name": name, "data_type": "TYPE_FP32", "dims": [4]})
        if not config.as_dict()["output"]:
            config.add_output({"name": "OUTPUT", "data_type": "TYPE_FP32", "dims": [4]})
        return config

    def initialize(self, args):
        assert os.path.join(args["model_repository"], args["model_version"]) == pb_utils.get_model_dir()
        with open(os.path.join(pb_utils.get_model_dir(), "model.json")) as f:
            self.operation = json.load(f)["operation"]
        self.family = pb_utils.MetricFamily("add_sub_calls", "calls of the add_sub backend",
                                            pb_utils.MetricFamily.COUNTER)
        self.calls = self.family.Metric({"model": args["model_name"]})

    def execute(self, requests):
        out = []
        for r in requests:
            a = pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()
            b = pb_utils.get_input_tensor_by_name(r, "INPUT1").as_numpy()
            self.calls.increment(1)
            result = a + b if self.operation == "add" else a - b
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT", result)]))
        return out
'''
# a decoupled backend: streams model.json's count of responses for each request
STREAMER = '''
import json, os
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        assert pb_utils.using_decoupled_model_transaction_policy(json.loads(args["model_config"]))
        with open(os.path.join(pb_utils.get_model_dir(), "model.json")) as f:
            self.count = json.load(f)["count"]

    def execute(self, requests):
        for r in requests:
            sender = r.get_response_sender()
            for i in range(self.count):
                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("TOKEN", np.array([i], np.int32))]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
'''
STREAMER_CONFIG = ('backend: "streamer"\nmodel_transaction_policy { decoupled: true }\n'
                   'input [ { name: "IN", data_type: TYPE_INT32, dims: [ 1 ] } ]\n'
                   'output [ { name: "TOKEN", data_type: TYPE_INT32, dims: [ 1 ] } ]\n')


def _layout(tmp_path):
    backends, repo = tmp_path / "backends", tmp_path / "models"
    (backends / "add_sub").mkdir(parents=True)
    (backends / "add_sub" / "model.py").write_text(ADD_SUB)
    (backends / "streamer").mkdir()
    (backends / "streamer" / "model.py").write_text(STREAMER)
    models = {  # name -> (config, model.json, versions)
        "add": ('backend: "add_sub"\n', {"operation": "add"}, (1, 2)),
        "sub": ('backend: "add_sub"\n', {"operation": "sub"}, (1,)),
        "add_too": ('backend: "add_sub"\nruntime: "model.py"\n', {"operation": "add"}, (1,)),
        "stream": (STREAMER_CONFIG, {"count": 3}, (1,)),
        # Triton's words for each way a backend is not found
        "no_backend": ('backend: "nowhere"\n', {}, (1,)),
        "no_runtime": ('backend: "nowhere"\nruntime: "model.py"\n', {}, (1,)),
        "cpp_runtime": ('backend: "add_sub"\nruntime: "libtriton_add_sub.so"\n', {}, (1,)),
    }
    for name, (config, files, versions) in models.items():
        (repo / name).mkdir(parents=True)
        (repo / name / "config.pbtxt").write_text(config)
        for v in versions:
            (repo / name / str(v)).mkdir()
            (repo / name / str(v) / "model.json").write_text(json.dumps(files))
    return backends, repo


def _add_sub(client, model: str, version: str = "") -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    a, b = np.random.rand(4).astype(np.float32), np.random.rand(4).astype(np.float32)
    inputs = [grpcclient.InferInput("INPUT0", [4], "FP32"), grpcclient.InferInput("INPUT1", [4], "FP32")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    result = client.infer(model, inputs, model_version=version, outputs=[grpcclient.InferRequestedOutput("OUTPUT")])
    return a, b, result.as_numpy("OUTPUT")


def test_one_backend_serves_several_models(start_server, tmp_path):
    backends, repo = _layout(tmp_path)
    server = start_server([repo], f"--backend-directory={backends}", "--model-control-mode=explicit")
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    # as Triton's qa test loads them: one with a version policy in the load's config
    grpc.load_model("add", config='{"backend":"add_sub","version_policy":{"latest":{"num_versions":2}}}')
    for name in ("sub", "add_too", "stream"):
        grpc.load_model(name)
    for version in ("1", "2"):
        assert grpc.is_model_ready("add", model_version=version)
        a, b, out = _add_sub(grpc, "add", version)
        assert np.allclose(out, a + b)
    a, b, out = _add_sub(grpc, "sub")
    assert np.allclose(out, a - b)
    a, b, out = _add_sub(grpc, "add_too")
    assert np.allclose(out, a + b)

    # the config says which backend, and the runtime Triton writes into it; the tensors are auto-completed
    http = httpclient.InferenceServerClient(server.url)
    config = http.get_model_config("sub")
    assert config["backend"] == "add_sub" and config["runtime"] == "model.py"
    assert [t["name"] for t in config["input"]] == ["INPUT0", "INPUT1"]

    # a decoupled model of a python-based backend streams its responses
    responses: list = []
    grpc.start_stream(callback=lambda result, error: responses.append(error or result.as_numpy("TOKEN")[0]))
    x = grpcclient.InferInput("IN", [1], "INT32")
    x.set_data_from_numpy(np.array([0], np.int32))
    grpc.async_stream_infer("stream", [x])
    grpc.stop_stream()
    assert responses == [0, 1, 2]

    # the backend's custom metric, one series per model; statistics and the status document list them
    metrics = scrape_metrics(server)
    assert metrics['add_sub_calls{model="sub"}'] == 1 and metrics['add_sub_calls{model="add"}'] == 2
    stats = {s["name"] for s in http.get_inference_statistics()["model_stats"]}
    assert {"add", "sub", "add_too", "stream"} <= stats
    status, _, body = http_request(server.metrics_port, "GET", "/status.json")
    assert status == 200 and {"add", "sub", "stream"} <= {m["name"] for m in orjson.loads(body)["models"]}

    # where no backend is found: Triton's words, and the server serves on
    messages = {}
    for name in ("no_backend", "no_runtime", "cpp_runtime"):
        with pytest.raises(InferenceServerException) as e:
            grpc.load_model(name)
        messages[name] = e.value.message()
    assert "unable to find backend library for backend 'nowhere', try specifying runtime on the model " \
           "configuration" in messages["no_backend"]
    assert f"unable to find Python backend based backend library 'model.py' for model 'no_runtime', searched: " \
           f"'{backends}/nowhere/model.py'" in messages["no_runtime"]
    assert "runtime 'libtriton_add_sub.so' of backend 'add_sub' is a C++ backend library" in messages["cpp_runtime"]
    a, b, out = _add_sub(grpc, "sub")
    assert np.allclose(out, a - b)


def test_without_a_backend_directory_a_python_based_backend_is_unknown(start_server, tmp_path):
    _, repo = _layout(tmp_path)
    server = start_server([repo], "--model-control-mode=explicit", "--backend-directory=")
    with pytest.raises(InferenceServerException) as e:
        grpcclient.InferenceServerClient(server.grpc_url).load_model("sub")
    assert "backend 'add_sub' is not available in this server" in e.value.message()
    assert "--backend-directory" in e.value.message()

