"""Python models calling other models of the server (BLS), with exec() and async_exec()."""

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException


def _call(server, target):
    client = httpclient.InferenceServerClient(server.url)
    a = np.array([[1.0, 2.0, 3.0]], np.float32)
    inputs = [httpclient.InferInput("A", [1, 3], "FP32"), httpclient.InferInput("TARGET", [1], "BYTES")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(np.array([target.encode()], dtype=object))
    return client.infer("bls", inputs).as_numpy("C")


@pytest.mark.parametrize("target", ["add", "add_py"], ids=["exec-onnx", "async_exec-python"])
def test_bls_reaches_other_models(server, target):
    np.testing.assert_array_equal(_call(server, target), np.array([[4.0, 8.0, 12.0]], np.float32))


def test_bls_error_comes_back_to_the_caller(server):
    with pytest.raises(InferenceServerException, match="Request for unknown model: 'nope' is not found"):
        _call(server, "nope")
