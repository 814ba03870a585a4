"""The python backend's API beyond the common path, used the way Triton's documentation shows."""

import numpy as np
import pytest
import tritonclient.http as httpclient

from conftest import X_TO_Y_CONFIG, write_model

DLPACK_MODEL = """
import numpy as np
import torch
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X")
            doubled = torch.from_dlpack(x) * 2  # the input's own memory, through __dlpack__
            y = pb_utils.Tensor.from_dlpack("Y", doubled)  # a producer object
            back = pb_utils.Tensor.from_dlpack("Y", y.to_dlpack())  # and a bare capsule
            assert x.__dlpack_device__() == (1, 0) and back.is_cpu()
            responses.append(pb_utils.InferenceResponse([back]))
        return responses
"""


def test_tensors_go_through_dlpack(start_server, tmp_path):
    pytest.importorskip("torch", reason="torch is not installed (pip install 'tritonmp[torch]')")
    write_model(tmp_path / "repo", "dlpack", DLPACK_MODEL, X_TO_Y_CONFIG)
    server = start_server([tmp_path / "repo"])
    x = httpclient.InferInput("X", [1], "FP32")
    x.set_data_from_numpy(np.array([21.0], np.float32))
    client = httpclient.InferenceServerClient(server.url)
    try:
        assert client.infer("dlpack", [x]).as_numpy("Y").tolist() == [42.0]
    finally:
        client.close()  # here, not by the garbage collector in some other thread


CONTROL_MODEL = """
import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        seen = [pb_utils.is_model_ready("add"), pb_utils.is_model_ready("add", "1"), pb_utils.is_model_ready("nope")]
        pb_utils.unload_model("add")
        seen.append(pb_utils.is_model_ready("add"))
        config = json.dumps({"platform": "onnxruntime_onnx", "max_batch_size": 2})
        with open(self.onnx, "rb") as f:
            pb_utils.load_model("added", config=config, files={"file:1/model.onnx": f.read()})
        seen.append(pb_utils.is_model_ready("added"))
        try:
            pb_utils.load_model("nope")
        except pb_utils.TritonModelException as e:
            seen.append("failed to load 'nope'" in str(e))
        return [pb_utils.InferenceResponse([pb_utils.Tensor("Y", np.array(seen, np.float32))]) for _ in requests]

    def initialize(self, args):
        import os

        self.onnx = os.path.join(args["model_repository"], "add.onnx")  # shipped beside the model
"""
CONTROL_CONFIG = ('backend: "python"\nmax_batch_size: 0\ninput [ { name: "X", data_type: TYPE_FP32, dims: [ 1 ] } ]\n'
                  'output [ { name: "Y", data_type: TYPE_FP32, dims: [ -1 ] } ]\n')


def test_a_model_checks_loads_and_unloads_models(start_server, tmp_path, example_repo):
    import shutil

    repo = tmp_path / "repo"
    shutil.copytree(example_repo / "add", repo / "add")
    write_model(repo, "controller", CONTROL_MODEL, CONTROL_CONFIG)
    shutil.copy(example_repo / "add" / "1" / "model.onnx", repo / "controller" / "add.onnx")
    server = start_server([repo], "--model-control-mode=explicit", "--load-model=add", "--load-model=controller")
    client = httpclient.InferenceServerClient(server.url)
    x = httpclient.InferInput("X", [1], "FP32")
    x.set_data_from_numpy(np.zeros(1, np.float32))
    try:
        assert client.infer("controller", [x]).as_numpy("Y").tolist() == [1, 1, 0, 0, 1, 1]
        assert not client.is_model_ready("add") and client.is_model_ready("added")
        assert client.get_model_config("added")["max_batch_size"] == 2
    finally:
        client.close()
