"""Configuration: errors name the file, the field and the fix; `tritonmp check` lists them all;
ONNX configs are completed from the graph; metadata and config answers have Triton's shape."""

import importlib.util
import shutil
import subprocess
from pathlib import Path

import orjson
import pytest

from conftest import SERVED_EXTENSIONS, TRITONMP
from make_example_repo import binary_op_model, write

ADD_CONFIG = """
name: "{name}"
platform: "onnxruntime_onnx"
max_batch_size: 8
input [ {{ name: "A", data_type: TYPE_FP32, dims: {dims} }}, {{ name: "B", data_type: TYPE_FP32, dims: [ 3 ] }} ]
output [ {{ name: "C", data_type: {out_type}, dims: [ 3 ] }} ]
"""


def _onnx_model(repo: Path, name: str, config: str | None = None, **fields) -> Path:
    model_dir = repo / name
    write(binary_op_model("Add"), str(model_dir / "1" / "model.onnx"))
    if config is None:
        config = ADD_CONFIG.format(**{"name": name, "dims": "[ 3 ]", "out_type": "TYPE_FP32", **fields})
    if config:
        (model_dir / "config.pbtxt").write_text(config)
    return model_dir


def _check(*args):
    return subprocess.run([*TRITONMP, "check", *map(str, args)], capture_output=True, text=True, timeout=120)


@pytest.fixture
def bad_repo(tmp_path):
    repo = tmp_path / "bad"
    _onnx_model(repo, "tutorial_dims", dims="[ -1, 3 ]")
    _onnx_model(repo, "wrong_name", config=ADD_CONFIG.format(name="other", dims="[ 3 ]", out_type="TYPE_FP32"))
    _onnx_model(repo, "wrong_type", out_type="TYPE_INT32")
    _onnx_model(repo, "garbled", config='name: "garbled"\nmax_batch_size: eight\n')
    _onnx_model(repo, "unknown_input", config=ADD_CONFIG.format(name="unknown_input", dims="[ 3 ]",
                                                                 out_type="TYPE_FP32").replace('"A"', '"Z"'))
    (repo / "torch_model" / "1").mkdir(parents=True)
    (repo / "torch_model" / "1" / "model.pt").write_bytes(b"not really")
    (repo / "torch_model" / "config.pbtxt").write_text('platform: "pytorch_libtorch"\nmax_batch_size: 1\n')
    (repo / "trt_model" / "1").mkdir(parents=True)
    (repo / "trt_model" / "1" / "model.plan").write_bytes(b"not really")
    (repo / "trt_model" / "config.pbtxt").write_text('platform: "tensorrt_plan"\nmax_batch_size: 1\n')
    (repo / "no_versions").mkdir()
    (repo / "no_versions" / "config.pbtxt").write_text('backend: "python"\n')
    return repo


def test_check_reports_every_problem_and_exits_1(bad_repo):
    result = _check(bad_repo)
    assert result.returncode == 1, result.stdout
    out = result.stdout
    tutorial = [line for line in out.splitlines() if "tutorial_dims" in line]
    assert tutorial and "config.pbtxt: input[0].dims:" in tutorial[0]
    assert "dims exclude the batch dimension when max_batch_size > 0, so use dims: [3]" in tutorial[0]
    assert "wrong_name/config.pbtxt: name: 'other' differs from the model's directory name 'wrong_name'" in out
    assert ("wrong_type/config.pbtxt: output[0].data_type: TYPE_INT32 for 'C', but the ONNX model has "
            "TYPE_FP32") in out
    assert "garbled/config.pbtxt: not a valid ModelConfig in protobuf text format" in out
    assert ("unknown_input/config.pbtxt: input[0].name: 'Z' is not an input of the ONNX model; "
            "its inputs are: A, B") in out
    if importlib.util.find_spec("tensorrt") is None:
        assert ("trt_model/config.pbtxt: backend: the tensorrt backend needs the 'tensorrt' package, which is not "
                "installed; install it with: pip install 'tritonmp[tensorrt]'") in out
    else:
        assert "trt_model/1/model.plan: " in out
    if importlib.util.find_spec("torch") is None:
        assert "torch_model/config.pbtxt: backend: the pytorch backend needs the 'torch' package" in out
    else:
        assert "torch_model/config.pbtxt: input: a TorchScript model does not describe its tensors" in out
    assert "no_versions: no version directory" in out
    assert "8 model(s) checked, 8 problem(s) found" in out  # the torch model's one, with torch or without


def test_check_passes_a_good_repository(example_repo):
    result = _check(example_repo)
    assert result.returncode == 0, result.stdout
    assert "all good" in result.stdout


def test_server_refuses_to_start_when_a_model_fails_by_default(start_server, example_repo, bad_repo):
    server = start_server([bad_repo], wait=False)
    assert server.proc.wait(60) == 1
    log = server.log()
    assert "load failed for model 'tutorial_dims'" in log
    assert "dims exclude the batch dimension" in log


def test_good_models_serve_beside_broken_ones_without_exit_on_error(start_server, example_repo, bad_repo):
    server = start_server([example_repo, bad_repo], "--exit-on-error=false", "--strict-readiness=false")
    assert server.get("/v2/models/add/ready")[0] == 200
    assert server.get("/v2/models/tutorial_dims/ready")[0] == 400
    status, _, raw = server.post("/v2/models/tutorial_dims/infer", b'{"inputs": []}')
    assert status == 404  # as Triton answers for a model with no version it can serve
    assert "has no available versions" in orjson.loads(raw)["error"]


def test_strict_readiness_keeps_the_server_unready_while_a_model_is_down(start_server, example_repo, bad_repo):
    server = start_server([example_repo, bad_repo], "--exit-on-error=false", wait=False)
    server.wait_live()
    server.wait_until(lambda: "Model" in server.log() and "Status" in server.log(), what="model table")
    assert server.get("/v2/health/ready")[0] == 400
    assert server.get("/v2/models/add/ready")[0] == 200


def test_missing_config_is_completed_from_the_onnx_graph(start_server, tmp_path):
    repo = tmp_path / "auto"
    _onnx_model(repo, "plain", config="")
    server = start_server([repo])
    meta = orjson.loads(server.get("/v2/models/plain")[2])
    assert meta["platform"] == "onnxruntime_onnx"
    assert meta["inputs"] == [{"name": "A", "datatype": "FP32", "shape": [-1, 3]},
                              {"name": "B", "datatype": "FP32", "shape": [-1, 3]}]
    config = orjson.loads(server.get("/v2/models/plain/config")[2])
    assert config["max_batch_size"] == 4
    assert config["backend"] == "onnxruntime"
    assert "dynamic_batching" in config


def test_auto_complete_can_be_disabled(tmp_path):
    repo = tmp_path / "auto"
    _onnx_model(repo, "plain", config="")
    result = _check(repo, "--disable-auto-complete-config")
    assert result.returncode == 1
    assert "missing, and auto-complete is disabled" in result.stdout


def test_model_metadata_and_config_match_triton(server):
    meta = orjson.loads(server.get("/v2/models/add_py")[2])
    assert meta == {"name": "add_py", "versions": ["1"], "platform": "python",
                    "inputs": [{"name": "A", "datatype": "FP32", "shape": [-1, 3]},
                               {"name": "B", "datatype": "FP32", "shape": [-1, 3]}],
                    "outputs": [{"name": "C", "datatype": "FP32", "shape": [-1, 3]}]}
    assert orjson.loads(server.get("/v2/models/add_py/versions/1")[2]) == meta
    status, _, raw = server.get("/v2/models/add_py/versions/2")
    assert status == 404
    assert orjson.loads(raw) == {"error": "Request for unknown model: 'add_py' version 2 is not found"}
    config = orjson.loads(server.get("/v2/models/add_py/config")[2])
    assert config["name"] == "add_py" and config["backend"] == "python" and config["platform"] == ""
    assert config["input"][0] == {"name": "A", "data_type": "TYPE_FP32", "format": "FORMAT_NONE", "dims": [3],
                                  "is_shape_tensor": False, "allow_ragged_batch": False, "optional": False,
                                  "is_non_linear_format_io": False}
    assert config["dynamic_batching"]["preferred_batch_size"] == [8]
    assert config["instance_group"][0]["name"] == "add_py_0"
    assert config["default_model_filename"] == "model.py"


def test_server_metadata_lists_only_what_is_served(server):
    meta = orjson.loads(server.get("/v2")[2])
    assert meta["name"] == "triton"
    assert set(meta["extensions"]) == SERVED_EXTENSIONS


def test_version_policy_serves_the_chosen_versions(start_server, tmp_path):
    repo = tmp_path / "versions"
    model = _onnx_model(repo, "multi", config="")
    for v in (2, 3):
        shutil.copytree(model / "1", model / str(v))
    (model / "config.pbtxt").write_text('version_policy: { specific: { versions: [1, 3] } }\n')
    server = start_server([repo])
    assert orjson.loads(server.get("/v2/models/multi")[2])["versions"] == ["1", "3"]
    assert server.get("/v2/models/multi/versions/2/ready")[0] == 400
    body = orjson.dumps({"inputs": [{"name": n, "shape": [1, 3], "datatype": "FP32", "data": [1, 2, 3]}
                                    for n in "AB"]})
    status, _, raw = server.post("/v2/models/multi/infer", body)
    assert status == 200 and orjson.loads(raw)["model_version"] == "3"
    status, _, raw = server.post("/v2/models/multi/versions/1/infer", body)
    assert status == 200 and orjson.loads(raw)["model_version"] == "1"


SELF_DESCRIBING = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    @staticmethod
    def auto_complete_config(auto_complete_model_config):
        auto_complete_model_config.add_input({"name": "IN", "data_type": "TYPE_INT32", "dims": [2]})
        auto_complete_model_config.add_output({"name": "OUT", "data_type": "TYPE_INT32", "dims": [2]})
        auto_complete_model_config.set_max_batch_size(4)
        auto_complete_model_config.set_dynamic_batching()
        return auto_complete_model_config

    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", pb_utils.get_input_tensor_by_name(r, "IN")
                                                            .as_numpy() * 2)]) for r in requests]
'''


def test_python_model_completes_its_own_config(start_server, tmp_path):
    model = tmp_path / "repo" / "selfdesc"
    (model / "1").mkdir(parents=True)
    (model / "1" / "model.py").write_text(SELF_DESCRIBING)
    server = start_server([tmp_path / "repo"])
    meta = orjson.loads(server.get("/v2/models/selfdesc")[2])
    assert meta["inputs"] == [{"name": "IN", "datatype": "INT32", "shape": [-1, 2]}]
    config = orjson.loads(server.get("/v2/models/selfdesc/config")[2])
    assert config["max_batch_size"] == 4 and config["dynamic_batching"]["preferred_batch_size"] == [4]
    body = orjson.dumps({"inputs": [{"name": "IN", "shape": [1, 2], "datatype": "INT32", "data": [3, 4]}]})
    assert orjson.loads(server.post("/v2/models/selfdesc/infer", body)[2])["outputs"][0]["data"] == [6, 8]


def test_auto_complete_config_errors_are_reported(tmp_path):
    model = tmp_path / "repo" / "clash"
    (model / "1").mkdir(parents=True)
    (model / "1" / "model.py").write_text(SELF_DESCRIBING)
    (model / "config.pbtxt").write_text('backend: "python"\nmax_batch_size: 2\n')
    result = _check(tmp_path / "repo")
    assert result.returncode == 1
    assert "auto_complete_config: auto_complete_config failed: ValueError: configuration specified " \
           "max_batch_size 2, but auto-complete-config tries to set it to 4" in result.stdout


def test_onnx_session_parameters_reach_onnxruntime(start_server, tmp_path):
    repo = tmp_path / "threads"
    _onnx_model(repo, "quiet", config="")
    _onnx_model(repo, "spinning", config='parameters { key: "session.intra_op.allow_spinning" '
                                         'value: { string_value: "1" } }\n')
    server = start_server([repo])
    log = server.log()
    assert "'quiet' version 1 is ready" in log and "'spinning' version 1 is ready" in log
    quiet = next(line for line in log.splitlines() if "'quiet' version 1 is ready" in line)
    spinning = next(line for line in log.splitlines() if "'spinning' version 1 is ready" in line)
    assert "intra-op threads spin off" in quiet and "intra-op threads spin on" in spinning
