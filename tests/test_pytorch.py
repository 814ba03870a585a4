"""The PyTorch backend with a TorchScript model made here (skipped where torch is not installed:
`make test-torch` installs it)."""

import warnings

import numpy as np
import pytest
import tritonclient.http as httpclient

torch = pytest.importorskip("torch", reason="torch is not installed (install tritonmp[torch], or make test-torch)")


class AddSub(torch.nn.Module):
    def forward(self, a, b):
        return a + b, a - b


@pytest.fixture
def repo(tmp_path):
    model = tmp_path / "repo" / "addsub"
    (model / "1").mkdir(parents=True)
    with warnings.catch_warnings():  # TorchScript is what Triton's libtorch backend serves, deprecated or not
        warnings.filterwarnings("ignore", "`torch.jit.script` is deprecated", DeprecationWarning)
        torch.jit.script(AddSub()).save(str(model / "1" / "model.pt"))
    (model / "config.pbtxt").write_text(
        'platform: "pytorch_libtorch"\nmax_batch_size: 8\ndynamic_batching { }\n'
        'input [ { name: "INPUT__1", data_type: TYPE_FP32, dims: [ 3 ] }, '
        '{ name: "INPUT__0", data_type: TYPE_FP32, dims: [ 3 ] } ]\n'
        'output [ { name: "OUTPUT__0", data_type: TYPE_FP32, dims: [ 3 ] }, '
        '{ name: "OUTPUT__1", data_type: TYPE_FP32, dims: [ 3 ] } ]\n')
    return tmp_path / "repo"


def test_torchscript_model_serves_with_indexed_names(start_server, repo):
    server = start_server([repo])
    client = httpclient.InferenceServerClient(server.url)
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    b = np.ones((2, 3), np.float32)
    inputs = [httpclient.InferInput("INPUT__0", [2, 3], "FP32"), httpclient.InferInput("INPUT__1", [2, 3], "FP32")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    result = client.infer("addsub", inputs)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT__0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT__1"), a - b)
    assert client.get_model_metadata("addsub")["platform"] == "pytorch_libtorch"
    assert "torch " in server.log() and "on cpu" in server.log()
