"""Implicit sequence state (`sequence_batching.state`): the server gives the model each state's input
with every request of a sequence and keeps its output for the sequence's next request, in the worker
that runs the sequence; initial state from zeros or a data file; clients neither send the state nor
see it unless the config lists it as an output; python and ONNX models alike, the ONNX one batched
with placeholder rows."""

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from onnx import TensorProto, helper
from tritonclient.utils import InferenceServerException

from conftest import TRITONMP, serving, write_model
from make_example_repo import write

STATEFUL_PY = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            state = pb_utils.get_input_tensor_by_name(request, "INPUT_STATE").as_numpy()
            total = state + pb_utils.get_input_tensor_by_name(request, "INPUT").as_numpy()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT", total),
                                                         pb_utils.Tensor("OUTPUT_STATE", total)]))
        return responses
"""


def _config(backend: str, initial: str, extra_output: str = "") -> str:
    return (f'{backend}\nmax_batch_size: 4\n'
            'sequence_batching {\n  max_sequence_idle_microseconds: 30000000\n'
            '  control_input [ { name: "START", control [ { kind: CONTROL_SEQUENCE_START, '
            'int32_false_true: [ 0, 1 ] } ] } ]\n'
            '  state [ { input_name: "INPUT_STATE", output_name: "OUTPUT_STATE", data_type: TYPE_INT32, '
            f'dims: [ 1 ]{initial} }} ]\n}}\n'
            'input [ { name: "INPUT", data_type: TYPE_INT32, dims: [ 1 ] } ]\n'
            f'output [ {{ name: "OUTPUT", data_type: TYPE_INT32, dims: [ 1 ] }}{extra_output} ]\n')


ZERO = ', initial_state: { data_type: TYPE_INT32, dims: [ 1 ], zero_data: true, name: "zero" }'
FROM_FILE = ', initial_state: { data_type: TYPE_INT32, dims: [ 1 ], data_file: "hundred", name: "hundred" }'
STATE_OUTPUT = ', { name: "OUTPUT_STATE", data_type: TYPE_INT32, dims: [ 1 ] }'


def _onnx_accumulator(path) -> None:
    shape = ["N", 1]
    graph = helper.make_graph(
        [helper.make_node("Add", ["INPUT", "INPUT_STATE"], ["OUTPUT"]),
         helper.make_node("Identity", ["OUTPUT"], ["OUTPUT_STATE"])], "accumulator",
        [helper.make_tensor_value_info("INPUT", TensorProto.INT32, shape),
         helper.make_tensor_value_info("INPUT_STATE", TensorProto.INT32, shape),
         helper.make_tensor_value_info("START", TensorProto.INT32, shape)],
        [helper.make_tensor_value_info("OUTPUT", TensorProto.INT32, shape),
         helper.make_tensor_value_info("OUTPUT_STATE", TensorProto.INT32, shape)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    write(model, str(path))


def _onnx_concatenator(path) -> None:
    """A string state: the sequence's inputs so far, joined."""
    shape = ["N", 1]
    graph = helper.make_graph(
        [helper.make_node("StringConcat", ["INPUT_STATE", "INPUT"], ["OUTPUT"]),
         helper.make_node("Identity", ["OUTPUT"], ["OUTPUT_STATE"])], "concatenator",
        [helper.make_tensor_value_info("INPUT", TensorProto.STRING, shape),
         helper.make_tensor_value_info("INPUT_STATE", TensorProto.STRING, shape),
         helper.make_tensor_value_info("START", TensorProto.INT32, shape)],
        [helper.make_tensor_value_info("OUTPUT", TensorProto.STRING, shape),
         helper.make_tensor_value_info("OUTPUT_STATE", TensorProto.STRING, shape)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])
    model.ir_version = 9
    write(model, str(path))


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("state")
    write_model(root, "state_py", STATEFUL_PY, _config('backend: "python"', ZERO))
    model = write_model(root, "state_file_py", STATEFUL_PY, _config('backend: "python"', FROM_FILE, STATE_OUTPUT))
    (model / "initial_state").mkdir()
    np.array([100], np.int32).tofile(model / "initial_state" / "hundred")
    _onnx_accumulator(root / "state_onnx" / "1" / "model.onnx")
    (root / "state_onnx" / "config.pbtxt").write_text(_config('platform: "onnxruntime_onnx"', ZERO))
    _onnx_concatenator(root / "string_state_onnx" / "1" / "model.onnx")
    (root / "string_state_onnx" / "config.pbtxt").write_text(
        _config('platform: "onnxruntime_onnx"', "").replace("TYPE_INT32", "TYPE_STRING"))
    with serving([root], [], tmp_path_factory) as s:
        yield s


def _send(client, module, model, x, seq, **flags):
    inp = module.InferInput("INPUT", [1, 1], "INT32")
    inp.set_data_from_numpy(np.array([[x]], np.int32))
    result = client.infer(model, [inp], sequence_id=seq, **flags)
    outputs = ["OUTPUT", "OUTPUT_STATE"] if result.as_numpy("OUTPUT_STATE") is not None else ["OUTPUT"]
    return tuple(int(result.as_numpy(name)[0, 0]) for name in outputs)


@pytest.mark.parametrize("model", ["state_py", "state_onnx"])
@pytest.mark.parametrize("module", [httpclient, grpcclient], ids=["http", "grpc"])
def test_each_sequence_keeps_its_own_state(server, module, model):
    client = module.InferenceServerClient(server.url if module is httpclient else server.grpc_url)
    base = 1000 if module is grpcclient else 2000  # sequence IDs of their own per client
    assert _send(client, module, model, 1, base + 1, sequence_start=True) == (1,)
    assert _send(client, module, model, 10, base + 2, sequence_start=True) == (10,)  # a row of its own
    assert _send(client, module, model, 2, base + 1) == (3,)
    assert _send(client, module, model, 20, base + 2) == (30,)
    assert _send(client, module, model, 3, base + 1, sequence_end=True) == (6,)
    assert _send(client, module, model, 5, base + 1, sequence_start=True) == (5,)  # started again: initial state
    assert _send(client, module, model, 30, base + 2, sequence_end=True) == (60,)
    assert _send(client, module, model, 1, base + 1, sequence_end=True) == (6,)


def test_initial_state_from_a_file_and_the_state_as_an_output(server):
    client = httpclient.InferenceServerClient(server.url)
    assert _send(client, httpclient, "state_file_py", 1, 7, sequence_start=True) == (101, 101)
    assert _send(client, httpclient, "state_file_py", 2, 7, sequence_end=True) == (103, 103)


def test_a_string_state_starts_empty_and_grows(server):
    """A BYTES state: with no initial state it starts as empty elements (what Triton's zeroed buffer
    holds), and what onnxruntime returns as str goes back to the model as the next request's input."""
    client = grpcclient.InferenceServerClient(server.grpc_url)

    def send(text, seq, **flags):
        inp = grpcclient.InferInput("INPUT", [1, 1], "BYTES")
        inp.set_data_from_numpy(np.array([[text.encode()]], dtype=object))
        return client.infer("string_state_onnx", [inp], sequence_id=seq, **flags).as_numpy("OUTPUT")[0, 0]

    assert send("a", 1, sequence_start=True) == b"a"
    assert send("x", 2, sequence_start=True) == b"x"
    assert send("b", 1) == b"ab"
    assert send("c", 1, sequence_end=True) == b"abc"
    assert send("y", 2, sequence_end=True) == b"xy"


def test_clients_cannot_send_the_state(server):
    client = httpclient.InferenceServerClient(server.url)
    inputs = [httpclient.InferInput(name, [1, 1], "INT32") for name in ("INPUT", "INPUT_STATE")]
    for inp in inputs:
        inp.set_data_from_numpy(np.array([[1]], np.int32))
    with pytest.raises(InferenceServerException, match="expected 1 inputs but got 2 inputs for model 'state_py'"):
        client.infer("state_py", inputs, sequence_id=9, sequence_start=True)


def test_a_state_config_triton_would_refuse_is_refused(tmp_path):
    import subprocess

    bad = _config('backend: "python"', ', initial_state: { data_type: TYPE_INT32, dims: [ 1 ], '
                  'data_file: "missing", name: "x" }')
    write_model(tmp_path, "missing_file", STATEFUL_PY, bad)
    listed = _config('backend: "python"', ZERO).replace(
        'input [ { name: "INPUT"', 'input [ { name: "INPUT_STATE", data_type: TYPE_INT32, dims: [ 1 ] }, '
        '{ name: "INPUT"')
    write_model(tmp_path, "listed", STATEFUL_PY, listed)
    out = subprocess.run([*TRITONMP, "check", str(tmp_path)], capture_output=True, text=True, timeout=120).stdout
    assert ("missing_file/config.pbtxt: sequence_batching.state[0].initial_state.data_file: 'missing' is not a "
            "file in the model's initial_state directory") in out
    assert ("listed/config.pbtxt: sequence_batching.state[0].input_name: 'INPUT_STATE' is also listed as a model "
            "input") in out
