"""The OpenVINO backend, on OpenVINO IR models converted at test time from ONNX graphs with
openvino's own converter (skipped where openvino is not installed: `make test` installs it)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from onnx import TensorProto, helper
from tritonclient.utils import InferenceServerException

from conftest import add_inputs, serving
from make_example_repo import binary_op_model, write

ov = pytest.importorskip("openvino", reason="openvino is not installed (pip install 'tritonmp[openvino]')")


def _ir(model: onnx.ModelProto, directory, tmp_path) -> None:
    """Convert an ONNX graph to OpenVINO IR (model.xml + model.bin) in `directory`."""
    onnx_file = tmp_path / f"{directory.parent.name}.onnx"
    write(model, str(onnx_file))
    directory.mkdir(parents=True, exist_ok=True)
    ov.save_model(ov.convert_model(str(onnx_file)), str(directory / "model.xml"))


def _fixed_batch_add() -> onnx.ModelProto:
    """C = A + B over tensors of the fixed shape [1, 3]."""
    shape = [1, 3]
    graph = helper.make_graph(
        [helper.make_node("Add", ["A", "B"], ["C"])], "fixed",
        [helper.make_tensor_value_info("A", TensorProto.FLOAT, shape),
         helper.make_tensor_value_info("B", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("C", TensorProto.FLOAT, shape)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _pairs() -> onnx.ModelProto:
    """Y = X reshaped to [2, -1]: fails for an odd number of elements (a model error)."""
    shape_const = helper.make_tensor("shape", TensorProto.INT64, [2], [2, -1])
    graph = helper.make_graph(
        [helper.make_node("Reshape", ["X", "shape"], ["Y"])], "pairs",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [-1])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [2, -1])], initializer=[shape_const])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


ADD_TENSORS = (
    'input [ {{ name: "A", data_type: {a_type}, dims: [ 3 ] }}, {{ name: "B", data_type: TYPE_FP32, dims: [ 3 ] }} ]\n'
    'output [ {{ name: "C", data_type: TYPE_FP32, dims: [ 3 ] }} ]\n')

ADD_PARAMS = '''
backend: "openvino"
max_batch_size: 8
dynamic_batching { max_queue_delay_microseconds: 20000 }
instance_group [ { count: 2, kind: KIND_CPU } ]
input [ { name: "A", data_type: TYPE_FP32, dims: [ 3 ] }, { name: "B", data_type: TYPE_FP32, dims: [ 3 ] } ]
output [ { name: "C", data_type: TYPE_FP32, dims: [ 3 ] } ]
parameters { key: "NUM_STREAMS" value { string_value: "1" } }
parameters { key: "PERFORMANCE_HINT" value { string_value: "LATENCY" } }
parameters { key: "INFERENCE_NUM_THREADS" value { string_value: "1" } }
model_warmup [ { name: "zeros", batch_size: 2,
  inputs { key: "A" value { data_type: TYPE_FP32, dims: [ 3 ], zero_data: true } }
  inputs { key: "B" value { data_type: TYPE_FP32, dims: [ 3 ], zero_data: true } } } ]
'''

ENSEMBLE = '''
platform: "ensemble"
max_batch_size: 8
input [ { name: "X", data_type: TYPE_FP32, dims: [ 3 ] } ]
output [ { name: "DOUBLED", data_type: TYPE_FP32, dims: [ 3 ] } ]
ensemble_scheduling { step [ { model_name: "ov_params", model_version: -1,
  input_map { key: "A" value: "X" } input_map { key: "B" value: "X" } output_map { key: "C" value: "DOUBLED" } } ] }
'''


@pytest.fixture(scope="module")
def ov_repo(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ov")
    repo = tmp / "repo"
    # no config.pbtxt: completed from the IR
    _ir(binary_op_model("Add"), repo / "ov_add" / "1", tmp)
    # the ONNX file itself, read by OpenVINO, with Triton's openvino parameters
    write(binary_op_model("Add"), str(repo / "ov_params" / "1" / "model.onnx"))
    (repo / "ov_params" / "config.pbtxt").write_text(ADD_PARAMS + 'default_model_filename: "model.onnx"\n')
    # a fixed batch of 1 in the model, batched to 4 and padded
    _ir(_fixed_batch_add(), repo / "ov_padded" / "1", tmp)
    (repo / "ov_padded" / "config.pbtxt").write_text(
        'backend: "openvino"\nmax_batch_size: 4\n' + ADD_TENSORS.format(a_type="TYPE_FP32") +
        'parameters { key: "SKIP_OV_DYNAMIC_BATCHSIZE" value { string_value: "YES" } }\n'
        'parameters { key: "ENABLE_BATCH_PADDING" value { string_value: "YES" } }\n')
    _ir(_pairs(), repo / "ov_pairs" / "1", tmp)
    (repo / "ov_ensemble" / "1").mkdir(parents=True)
    (repo / "ov_ensemble" / "config.pbtxt").write_text(ENSEMBLE)
    # loaded on demand by the tests of load errors
    _ir(binary_op_model("Add"), repo / "ov_unknown_param" / "1", tmp)
    (repo / "ov_unknown_param" / "config.pbtxt").write_text(
        'backend: "openvino"\nparameters { key: "CPU_THREADS_NUM" value { string_value: "2" } }\n'
        'parameters { key: "NUM_STREAMS" value { string_value: "many" } }\n')
    _ir(binary_op_model("Add"), repo / "ov_wrong_config" / "1", tmp)
    (repo / "ov_wrong_config" / "config.pbtxt").write_text(
        'backend: "openvino"\nmax_batch_size: 4\n' + ADD_TENSORS.format(a_type="TYPE_INT32"))
    return repo


LOADED = ["ov_add", "ov_params", "ov_padded", "ov_pairs", "ov_ensemble"]


@pytest.fixture(scope="module")
def server(ov_repo, tmp_path_factory):
    args = ["--model-control-mode", "explicit", "--allow-client-shm", "true"]
    for name in LOADED:
        args += ["--load-model", name]
    with serving([ov_repo], args, tmp_path_factory) as s:
        yield s


def test_ir_without_config_is_completed_and_served_on_both_protocols(server):
    config = httpclient.InferenceServerClient(server.url).get_model_config("ov_add")
    assert config["backend"] == "openvino" and config["max_batch_size"] == 4
    assert [(t["name"], t["data_type"], t["dims"]) for t in config["input"]] == \
        [("A", "TYPE_FP32", [3]), ("B", "TYPE_FP32", [3])]
    assert "dynamic_batching" in config
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    b = np.full((2, 3), 0.5, np.float32)
    for module, url in ((httpclient, server.url), (grpcclient, server.grpc_url)):
        result = module.InferenceServerClient(url).infer("ov_add", add_inputs(module, a, b))
        np.testing.assert_array_equal(result.as_numpy("C"), a + b)
    metadata = httpclient.InferenceServerClient(server.url).get_model_metadata("ov_add")
    assert metadata["platform"] == "openvino"
    assert "openvino 20" in server.log()


def test_onnx_file_with_parameters_batches_across_instances(server):
    import concurrent.futures

    log = server.log()
    assert "streams 1, inference threads 1" in log
    client = grpcclient.InferenceServerClient(server.grpc_url)

    def one(i: int):
        a = np.full((1, 3), i, np.float32)
        return i, client.infer("ov_params", add_inputs(grpcclient, a)).as_numpy("C")

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        for i, c in pool.map(one, range(32)):
            np.testing.assert_array_equal(c, np.full((1, 3), 2 * i, np.float32))
    stats = client.get_inference_statistics("ov_params", as_json=True)["model_stats"][0]
    assert int(stats["inference_count"]) >= 32


def test_fixed_batch_model_is_padded(server):
    client = httpclient.InferenceServerClient(server.url)
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    np.testing.assert_array_equal(client.infer("ov_padded", add_inputs(httpclient, a)).as_numpy("C"), 2 * a)


def test_wrong_shape_and_model_error(server):
    client = httpclient.InferenceServerClient(server.url)
    bad = np.ones((1, 4), np.float32)
    with pytest.raises(InferenceServerException) as e:
        client.infer("ov_add", add_inputs(httpclient, bad))
    assert e.value.status() == "400" and "unexpected shape for input 'A'" in e.value.message()
    x = np.ones(3, np.float32)  # three elements cannot be made into pairs
    inp = httpclient.InferInput("X", [3], "FP32")
    inp.set_data_from_numpy(x)
    with pytest.raises(InferenceServerException) as e:
        client.infer("ov_pairs", [inp])
    assert e.value.status() == "500" and "OpenVINO failed" in e.value.message()
    inp = httpclient.InferInput("X", [4], "FP32")
    inp.set_data_from_numpy(np.arange(4, dtype=np.float32))
    np.testing.assert_array_equal(client.infer("ov_pairs", [inp]).as_numpy("Y"), [[0, 1], [2, 3]])


def test_ensemble_and_system_shared_memory_reach_the_openvino_model(server, request):
    client = httpclient.InferenceServerClient(server.url)
    x = np.arange(3, dtype=np.float32).reshape(1, 3)
    inp = httpclient.InferInput("X", [1, 3], "FP32")
    inp.set_data_from_numpy(x)
    np.testing.assert_array_equal(client.infer("ov_ensemble", [inp]).as_numpy("DOUBLED"), 2 * x)
    key = f"/ov-shm-{request.node.name[:12]}"
    handle = shm.create_shared_memory_region("ov", key, 3 * x.nbytes)
    try:
        shm.set_shared_memory_region(handle, [x, x + 1])
        client.register_system_shared_memory("ov", key, 3 * x.nbytes)
        inputs = add_inputs(httpclient, x, x + 1)
        inputs[0].set_shared_memory("ov", x.nbytes)
        inputs[1].set_shared_memory("ov", x.nbytes, offset=x.nbytes)
        out = httpclient.InferRequestedOutput("C")
        out.set_shared_memory("ov", x.nbytes, offset=2 * x.nbytes)
        client.infer("ov_add", inputs, outputs=[out])
        got = shm.get_contents_as_numpy(handle, np.float32, [1, 3], offset=2 * x.nbytes)
        np.testing.assert_array_equal(got, 2 * x + 1)
    finally:
        client.unregister_system_shared_memory()
        shm.destroy_shared_memory_region(handle)


def test_unknown_parameters_and_mismatched_configs_fail_the_load(server):
    client = httpclient.InferenceServerClient(server.url)
    with pytest.raises(InferenceServerException) as e:
        client.load_model("ov_unknown_param")
    assert "unknown openvino backend parameter(s) 'CPU_THREADS_NUM'" in e.value.message()
    with pytest.raises(InferenceServerException) as e:
        client.load_model("ov_wrong_config")
    assert "input[0].data_type: TYPE_INT32 for 'A', but the OpenVINO model has TYPE_FP32" in e.value.message()
    assert client.is_model_ready("ov_add")


def test_check_reads_openvino_models_before_serving(ov_repo):
    from test_config import _check

    out = _check(ov_repo).stdout
    assert "ov_unknown_param/1/model.xml: unknown openvino backend parameter(s) 'CPU_THREADS_NUM'" in out
    assert "ov_wrong_config/config.pbtxt: input[0].data_type: TYPE_INT32 for 'A', but the OpenVINO model has " \
           "TYPE_FP32" in out
    assert "ov_add" not in out and "ov_params" not in out
