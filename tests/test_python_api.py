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
    assert httpclient.InferenceServerClient(server.url).infer("dlpack", [x]).as_numpy("Y").tolist() == [42.0]
