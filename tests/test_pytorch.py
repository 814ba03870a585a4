"""The PyTorch backend with a TorchScript model made here (skipped where torch is not installed:
`make test-torch` installs it)."""

import warnings

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tritonmp.gpus import visible_gpus

torch = pytest.importorskip("torch", reason="torch is not installed (install tritonmp[torch], or make test-torch)")


class AddSub(torch.nn.Module):
    def forward(self, a, b):
        on_gpu = 100.0 if a.is_cuda and b.is_cuda else 0.0  # tells the client where the sums were made
        return a + b + on_gpu, a - b


@pytest.fixture
def repo(tmp_path):
    return _addsub_repo(tmp_path, "instance_group [ { kind: KIND_CPU } ]\n")  # also where GPUs are


def _addsub_repo(tmp_path, instance_group: str):
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
        '{ name: "OUTPUT__1", data_type: TYPE_FP32, dims: [ 3 ] } ]\n' + instance_group)
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


@pytest.mark.gpu
@pytest.mark.skipif(not visible_gpus(), reason="no NVIDIA GPU visible on this machine")
def test_kind_gpu_instance_runs_on_cuda_with_device_memory_in_and_out(start_server, tmp_path):
    if not torch.cuda.is_available():
        pytest.skip("torch here was built without CUDA")
    cudashm = pytest.importorskip("tritonclient.utils.cuda_shared_memory", reason="needs cuda-python")
    server = start_server([_addsub_repo(tmp_path, "instance_group [ { kind: KIND_GPU, gpus: [ 0 ] } ]\n")],
                          "--allow-client-shm=true")
    assert "on cuda:0" in server.log()
    a = np.arange(12, dtype=np.float32).reshape(4, 3)
    b = np.full((4, 3), 2, np.float32)
    client = grpcclient.InferenceServerClient(server.grpc_url)
    inputs = [grpcclient.InferInput("INPUT__0", [4, 3], "FP32"), grpcclient.InferInput("INPUT__1", [4, 3], "FP32")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    result = client.infer("addsub", inputs)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT__0"), a + b + 100)  # the sums were made on the GPU
    np.testing.assert_array_equal(result.as_numpy("OUTPUT__1"), a - b)
    region_in = cudashm.create_shared_memory_region("torch_in", 2 * a.nbytes, 0)
    region_out = cudashm.create_shared_memory_region("torch_out", a.nbytes, 0)
    try:
        cudashm.set_shared_memory_region(region_in, [a, b])
        client.register_cuda_shared_memory("torch_in", cudashm.get_raw_handle(region_in), 0, 2 * a.nbytes)
        client.register_cuda_shared_memory("torch_out", cudashm.get_raw_handle(region_out), 0, a.nbytes)
        inputs[0].set_shared_memory("torch_in", a.nbytes)
        inputs[1].set_shared_memory("torch_in", b.nbytes, offset=a.nbytes)
        outputs = [grpcclient.InferRequestedOutput("OUTPUT__0"), grpcclient.InferRequestedOutput("OUTPUT__1")]
        outputs[0].set_shared_memory("torch_out", a.nbytes)
        result = client.infer("addsub", inputs, outputs=outputs)
        np.testing.assert_array_equal(cudashm.get_contents_as_numpy(region_out, np.float32, [4, 3]), a + b + 100)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT__1"), a - b)
    finally:
        client.unregister_cuda_shared_memory()
        cudashm.destroy_shared_memory_region(region_in)
        cudashm.destroy_shared_memory_region(region_out)


class Accumulate(torch.nn.Module):
    """A stateful model: its START and READY controls and its implicit state come as forward()'s
    arguments, numbered among its input, and its state as its second output."""

    def forward(self, start, total, ready, x):
        total = torch.where(start > 0, x, total + x) * ready
        return total, total


def _accumulate_model(repo, name: str, names: list[str]) -> None:
    start, state, ready, x, out, state_out = names
    model = repo / name
    (model / "1").mkdir(parents=True)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "`torch.jit.script` is deprecated", DeprecationWarning)
        torch.jit.script(Accumulate()).save(str(model / "1" / "model.pt"))
    (model / "config.pbtxt").write_text(
        'platform: "pytorch_libtorch"\nmax_batch_size: 4\n'
        'sequence_batching {\n  max_sequence_idle_microseconds: 30000000\n  control_input [\n'
        f'    {{ name: "{ready}", control [ {{ kind: CONTROL_SEQUENCE_READY, int32_false_true: [ 0, 1 ] }} ] }},\n'
        f'    {{ name: "{start}", control [ {{ kind: CONTROL_SEQUENCE_START, int32_false_true: [ 0, 1 ] }} ] }}\n'
        '  ]\n'
        f'  state [ {{ input_name: "{state}", output_name: "{state_out}", data_type: TYPE_INT32, dims: [ 1 ] }} ]\n'
        '}\n'
        f'input [ {{ name: "{x}", data_type: TYPE_INT32, dims: [ 1 ] }} ]\n'
        f'output [ {{ name: "{out}", data_type: TYPE_INT32, dims: [ 1 ] }} ]\n'
        'instance_group [ { kind: KIND_CPU } ]\n')


def test_a_stateful_torchscript_model_gets_its_controls_and_state(start_server, tmp_path):
    """As Triton's libtorch backend: the sequence controls and state inputs are forward()'s
    arguments, placed by their `__N` suffix or else by forward()'s argument names."""
    models = {"by_suffix": ["START__0", "STATE__1", "READY__2", "INPUT__3", "OUTPUT__0", "STATE_OUT__1"],
              "by_argument_name": ["start", "total", "ready", "x", "OUTPUT", "STATE_OUT"]}
    for name, names in models.items():
        _accumulate_model(tmp_path / "repo", name, names)
    server = start_server([tmp_path / "repo"])
    client = grpcclient.InferenceServerClient(server.grpc_url)
    for name, names in models.items():
        x, out = names[3], names[4]

        def send(value, seq, name=name, x=x, out=out, **flags):
            inp = grpcclient.InferInput(x, [1, 1], "INT32")
            inp.set_data_from_numpy(np.array([[value]], np.int32))
            return int(client.infer(name, [inp], sequence_id=seq, **flags).as_numpy(out)[0, 0])

        assert send(1, 1, sequence_start=True) == 1
        assert send(10, 2, sequence_start=True) == 10
        assert send(2, 1) == 3
        assert send(20, 2, sequence_end=True) == 30
        assert send(3, 1, sequence_end=True) == 6
