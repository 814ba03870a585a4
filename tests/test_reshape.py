"""`reshape` of inputs and outputs, as Triton applies it: clients send and receive the shapes of the
config's dims, the model sees and makes the shapes of reshape.shape (the bytes as they are), with
variable dimensions carried across in order, batched or not, merged into batches (ONNX) or one
request at a time (python); a reshape Triton would refuse is refused in its words."""

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from onnx import TensorProto, helper

from conftest import TRITONMP, serving, write_model
from make_example_repo import write

SHAPES_PY = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("SEEN", np.array([x.shape], np.int64)), pb_utils.Tensor("Y", x)]))
        return responses
"""


def _identity_onnx(path, shape):
    graph = helper.make_graph([helper.make_node("Identity", ["X"], ["Y"])], "identity",
                              [helper.make_tensor_value_info("X", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, shape)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    write(model, str(path))


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("reshape")
    _identity_onnx(root / "square" / "1" / "model.onnx", ["N", 4])
    (root / "square" / "config.pbtxt").write_text(
        'platform: "onnxruntime_onnx"\nmax_batch_size: 4\ndynamic_batching { max_queue_delay_microseconds: 20000 }\n'
        'input [ { name: "X", data_type: TYPE_FP32, dims: [ 2, 2 ], reshape: { shape: [ 4 ] } } ]\n'
        'output [ { name: "Y", data_type: TYPE_FP32, dims: [ 2, 2 ], reshape: { shape: [ 4 ] } } ]\n')
    _identity_onnx(root / "rows" / "1" / "model.onnx", ["N"])
    (root / "rows" / "config.pbtxt").write_text(
        'platform: "onnxruntime_onnx"\nmax_batch_size: 8\n'
        'input [ { name: "X", data_type: TYPE_FP32, dims: [ 1 ], reshape: { shape: [ ] } } ]\n'
        'output [ { name: "Y", data_type: TYPE_FP32, dims: [ 1 ], reshape: { shape: [ ] } } ]\n')
    write_model(root, "shapes_py", SHAPES_PY, 'backend: "python"\nmax_batch_size: 4\n'
                'input [ { name: "X", data_type: TYPE_INT32, dims: [ 2, -1 ], reshape: { shape: [ 2, 1, -1 ] } } ]\n'
                'output [ { name: "SEEN", data_type: TYPE_INT64, dims: [ -1 ] },\n'
                '         { name: "Y", data_type: TYPE_INT32, dims: [ 2, -1 ], reshape: { shape: [ 2, 1, -1 ] } } ]\n')
    with serving([root], [], tmp_path_factory) as s:
        yield s


@pytest.mark.parametrize("module", [httpclient, grpcclient], ids=["http", "grpc"])
def test_the_model_sees_the_reshape_and_the_client_the_dims(server, module):
    client = module.InferenceServerClient(server.url if module is httpclient else server.grpc_url)
    x = np.arange(6, dtype=np.int32).reshape(1, 2, 3)
    inp = module.InferInput("X", [1, 2, 3], "INT32")
    inp.set_data_from_numpy(x)
    result = client.infer("shapes_py", [inp])
    assert result.as_numpy("SEEN").tolist() == [[1, 2, 1, 3]]  # the variable dimension carried across
    assert result.as_numpy("Y").shape == (1, 2, 3) and (result.as_numpy("Y") == x).all()
    metadata = client.get_model_metadata("shapes_py")
    inputs = metadata["inputs"] if module is httpclient else [{"shape": list(t.shape)} for t in metadata.inputs]
    assert [int(d) for d in inputs[0]["shape"]] == [-1, 2, -1]  # metadata tells the client's shapes


def test_reshaped_requests_batch_together(server):
    """ONNX batches merge requests: each is reshaped, batched, and split back in its own shape."""
    import concurrent.futures

    def one(i):
        x = np.full((1, 2, 2), i, np.float32)
        inp = httpclient.InferInput("X", [1, 2, 2], "FP32")
        inp.set_data_from_numpy(x)
        y = httpclient.InferenceServerClient(server.url).infer("square", [inp]).as_numpy("Y")
        return y.shape, float(y.flat[0])

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(one, range(8)))
    assert answers == [((1, 2, 2), float(i)) for i in range(8)]
    stats = httpclient.InferenceServerClient(server.url).get_inference_statistics("square")["model_stats"][0]
    assert stats["inference_count"] == 8


def test_an_empty_reshape_makes_the_batch_dimension_the_whole_shape(server):
    client = grpcclient.InferenceServerClient(server.grpc_url)
    x = np.array([[1.5], [2.5], [3.5]], np.float32)
    inp = grpcclient.InferInput("X", [3, 1], "FP32")
    inp.set_data_from_numpy(x)
    y = client.infer("rows", [inp]).as_numpy("Y")
    assert y.shape == (3, 1) and y.tolist() == x.tolist()


def test_reshapes_triton_refuses_are_refused_in_its_words(tmp_path):
    import subprocess

    def model(name, mbs, dims, reshape):
        write_model(tmp_path, name, SHAPES_PY, f'backend: "python"\nmax_batch_size: {mbs}\n'
                    f'input [ {{ name: "X", data_type: TYPE_INT32, dims: {dims}, reshape: {{ shape: {reshape} }} }} ]\n'
                    'output [ { name: "Y", data_type: TYPE_INT32, dims: [ -1 ] } ]\n')

    model("size", 4, "[ 2, 2 ]", "[ 3 ]")
    model("runs", 4, "[ 2, -1 ]", "[ -1, 2 ]")
    model("count", 4, "[ 2, -1, 3 ]", "[ 2, -1, 3, -1 ]")
    model("scalar", 0, "[ 1 ]", "[ ]")
    model("zero", 4, "[ 2 ]", "[ 0, 2 ]")
    model("fine", 4, "[ 2, 4, -1, 6 ]", "[ 8, -1, 1, 6 ]")  # Triton's own example of a valid one
    out = subprocess.run([*TRITONMP, "check", str(tmp_path)], capture_output=True, text=True, timeout=120).stdout
    prefix = "config.pbtxt: input[0].reshape: model input 'X' "
    assert f"size/{prefix}has different size for dims and reshape" in out
    assert f"runs/{prefix}has different size for dims and reshape" in out
    assert f"count/{prefix}has different number of variable-size dimensions for dims and reshape" in out
    assert (f"scalar/{prefix}cannot have empty reshape for non-batching model as scalar tensors are not "
            "supported") in out
    assert f"zero/{prefix}reshape dimensions must be integer >= 1, or -1 to indicate a variable-size dimension" in out
    assert "fine/" not in out and "6 model(s) checked, 5 problem(s) found" in out


