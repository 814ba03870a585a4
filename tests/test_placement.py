"""Where instances run: the initialize() args Triton gives, CUDA_VISIBLE_DEVICES per instance
(with a faked GPU list on machines without GPUs), and the real CUDA paths where a GPU exists."""

import json
import os
import shutil

import numpy as np
import orjson
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tritonmp.gpus import visible_gpus

from conftest import TEST_MODELS, add_inputs


def _whereami(server, model="whereami"):
    status, _, raw = server.post(f"/v2/models/{model}/infer", orjson.dumps(
        {"inputs": [{"name": "X", "shape": [1], "datatype": "FP32", "data": [0]}]}))
    assert status == 200, raw
    out = {o["name"]: o["data"][0] for o in orjson.loads(raw)["outputs"]}
    return out["DEVICES"], json.loads(out["ARGS"])


def _repo(tmp_path, config_tail=""):
    repo = tmp_path / "repo"
    shutil.copytree(TEST_MODELS / "whereami", repo / "whereami")
    with open(repo / "whereami" / "config.pbtxt", "a") as f:
        f.write(config_tail)
    return repo


def test_cpu_instance_gets_triton_args_and_no_gpu(start_server, tmp_path):
    server = start_server([_repo(tmp_path, 'instance_group [ { kind: KIND_CPU } ]\n')])  # also where GPUs are
    devices, args = _whereami(server)
    assert devices == ""
    assert args == {"model_instance_kind": "CPU", "model_instance_name": "whereami_0_0",
                    "model_instance_device_id": "0", "model_repository": str(tmp_path / "repo" / "whereami"),
                    "model_version": "1", "model_name": "whereami", "model_config_name": "whereami"}


def test_gpu_instances_are_each_pinned_to_one_gpu(start_server, tmp_path, monkeypatch):
    monkeypatch.setenv("TRITONMP_FAKE_GPUS", "0,1")
    server = start_server([_repo(tmp_path, 'instance_group [ { kind: KIND_GPU, gpus: [ 1 ] } ]\n')])
    devices, args = _whereami(server)
    assert devices == "1"
    assert args["model_instance_kind"] == "GPU" and args["model_instance_device_id"] == "1"


def test_group_naming_a_missing_gpu_fails_the_load(start_server, tmp_path, monkeypatch):
    monkeypatch.setenv("TRITONMP_FAKE_GPUS", "0")
    server = start_server([_repo(tmp_path, 'instance_group [ { kind: KIND_GPU, gpus: [ 3 ] } ]\n')], wait=False)
    assert server.proc.wait(60) == 1
    assert "names GPU 3, which is not visible (visible: [0])" in server.log()


def test_kind_gpu_without_gpus_fails_the_load_with_the_reason(tmp_path):
    from tritonmp.instances.pool import LoadError
    from tritonmp.lifecycle.model_version import instance_specs
    from tritonmp.repository import config as cfg

    repo = _repo(tmp_path, 'instance_group [ { kind: KIND_GPU } ]\n')
    completed = cfg.load(str(repo / "whereami"))
    with pytest.raises(LoadError, match="asks for KIND_GPU, but no GPU is visible"):
        instance_specs(completed.config, "auto", [])


def test_default_instances_go_to_the_gpus_only_where_the_framework_can_use_them(start_server, tmp_path,
                                                                             example_repo, monkeypatch):
    from tritonmp.backends import gpu_capable

    if gpu_capable("onnxruntime"):
        pytest.skip("this onnxruntime has the CUDA provider")
    monkeypatch.setenv("TRITONMP_FAKE_GPUS", "0")
    repo = _repo(tmp_path)
    shutil.copytree(example_repo / "add", repo / "add")  # no instance_group: Triton's default
    (repo / "add_auto").mkdir()
    shutil.copytree(example_repo / "add" / "1", repo / "add_auto" / "1")
    (repo / "add_auto" / "config.pbtxt").write_text(
        'platform: "onnxruntime_onnx"\nmax_batch_size: 8\ninstance_group [ { kind: KIND_AUTO } ]\n')
    (repo / "add_gpu").mkdir()
    shutil.copytree(example_repo / "add" / "1", repo / "add_gpu" / "1")
    (repo / "add_gpu" / "config.pbtxt").write_text(
        'platform: "onnxruntime_onnx"\nmax_batch_size: 8\ninstance_group [ { kind: KIND_GPU } ]\n')
    server = start_server([repo], "--model-control-mode", "explicit", "--load-model", "add",
                          "--load-model", "add_auto", "--load-model", "whereami")
    client = httpclient.InferenceServerClient(server.url)
    for name in ("add", "add_auto"):
        assert [g["kind"] for g in client.get_model_config(name)["instance_group"]] == ["KIND_CPU"]
        a = np.arange(6, dtype=np.float32).reshape(2, 3)
        np.testing.assert_array_equal(client.infer(name, add_inputs(httpclient, a)).as_numpy("C"), a + a)
    assert "model 'add': this onnxruntime has no CUDA provider" in server.log()
    assert "so its default instances run on the CPU" in server.log()
    assert _whereami(server)[1]["model_instance_kind"] == "GPU"  # python models take GPU instances, as on Triton
    with pytest.raises(InferenceServerException, match="needs onnxruntime's CUDAExecutionProvider"):
        client.load_model("add_gpu")  # asked for by name: the load fails with the reason


def test_gpu_support_reads_what_the_frameworks_say_of_themselves():
    from tritonmp.backends import gpu_capable

    ort = pytest.importorskip("onnxruntime")
    assert gpu_capable("onnxruntime") == ("CUDAExecutionProvider" in ort.get_available_providers())
    assert gpu_capable("python") and gpu_capable("tensorrt") and not gpu_capable("openvino")
    try:
        import torch
    except ImportError:
        assert not gpu_capable("pytorch")
    else:
        assert gpu_capable("pytorch") == torch.backends.cuda.is_built()


needs_gpu = pytest.mark.skipif(not visible_gpus() or os.environ.get("TRITONMP_FAKE_GPUS") is not None,
                               reason="no NVIDIA GPU visible on this machine")


@pytest.mark.gpu
@needs_gpu
def test_kind_gpu_onnx_instance_runs_on_the_cuda_provider(start_server, tmp_path):
    ort = pytest.importorskip("onnxruntime")
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        pytest.skip("onnxruntime here has no CUDAExecutionProvider (install tritonmp[gpu])")
    from make_example_repo import binary_op_model, write

    repo = tmp_path / "gpu"
    write(binary_op_model("Add"), str(repo / "add_gpu" / "1" / "model.onnx"))
    (repo / "add_gpu" / "config.pbtxt").write_text(
        'platform: "onnxruntime_onnx"\nmax_batch_size: 8\ninstance_group [ { kind: KIND_GPU, count: 1 } ]\n')
    server = start_server([repo])
    assert "onnxruntime providers: CUDAExecutionProvider" in server.log()
    client = httpclient.InferenceServerClient(url=server.url)
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    inputs = add_inputs(httpclient, a)
    np.testing.assert_array_equal(client.infer("add_gpu", inputs).as_numpy("C"), a + a)


@pytest.mark.gpu
@needs_gpu
def test_default_instances_are_one_per_visible_gpu(start_server, tmp_path):
    server = start_server([_repo(tmp_path)])
    config = orjson.loads(server.get("/v2/models/whereami/config")[2])
    assert [g["gpus"] for g in config["instance_group"]] == [[g] for g in visible_gpus()]


def test_the_default_instance_group_is_named_after_the_model_as_in_triton(start_server, tmp_path):
    if len(visible_gpus()) > 1:
        pytest.skip("with several GPUs the default instances are one group per GPU")
    server = start_server([_repo(tmp_path)])
    config = orjson.loads(server.get("/v2/models/whereami/config")[2])
    assert [g["name"] for g in config["instance_group"]] == ["whereami"]
    assert _whereami(server)[1]["model_instance_name"] == "whereami_0"


def test_requests_are_spread_over_the_instances(start_server, tmp_path):
    server = start_server([_repo(tmp_path, 'instance_group [ { kind: KIND_CPU, count: 2 } ]\n')])
    names = {_whereami(server)[1]["model_instance_name"] for _ in range(6)}
    assert names == {"whereami_0_0", "whereami_0_1"}


def test_kind_model_instances_see_every_gpu(start_server, tmp_path, monkeypatch):
    monkeypatch.setenv("TRITONMP_FAKE_GPUS", "0,1")
    server = start_server([_repo(tmp_path, 'instance_group [ { kind: KIND_MODEL, count: 1 } ]\n')])
    devices, args = _whereami(server)
    assert devices == "0,1" and args["model_instance_kind"] == "MODEL"
