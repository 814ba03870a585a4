"""Ragged batching: requests whose ragged input differs in shape batch together, the model takes
that input as one dimension of all their elements, the batch inputs the server makes tell the
requests apart, and a scattered batch output goes back to each request in its input's shape."""

import threading

import numpy as np
import pytest
import tritonclient.http as httpclient
from onnx import TensorProto, helper

from tritonmp.repository.ragged import Kind, batch_input_values

from conftest import TRITONMP, scrape_metrics, serving, write_model
from make_example_repo import write

CONFIG = """
platform: "onnxruntime_onnx"
max_batch_size: 8
dynamic_batching { preferred_batch_size: [ 3 ], max_queue_delay_microseconds: 10000000 }
input [ { name: "INPUT", data_type: TYPE_FP32, dims: [ -1 ], allow_ragged_batch: true } ]
batch_input [ { kind: BATCH_ACCUMULATED_ELEMENT_COUNT, target_name: "INDEX", data_type: TYPE_FP32,
                source_input: "INPUT" } ]
output [ { name: "OUT", data_type: TYPE_FP32, dims: [ -1 ] },
         { name: "ENDS", data_type: TYPE_FP32, dims: [ 1 ], reshape: { shape: [ ] } } ]
batch_output [ { target_name: "OUT", kind: BATCH_SCATTER_WITH_INPUT_SHAPE, source_input: "INPUT" } ]
"""


def test_batch_inputs_are_made_as_tritons_model_config_describes_them():
    shapes = [[1, 3], [1, 4], [1, 5]]
    assert batch_input_values(Kind.BATCH_ELEMENT_COUNT, shapes) == ([3], [3, 4, 5])
    assert batch_input_values(Kind.BATCH_ACCUMULATED_ELEMENT_COUNT, shapes) == ([3], [3, 7, 12])
    assert batch_input_values(Kind.BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO, shapes) == ([4], [0, 3, 7, 12])
    assert batch_input_values(Kind.BATCH_MAX_ELEMENT_COUNT_AS_SHAPE, shapes)[0] == [5]
    # model_config.proto's example: a batch-2 input of shape [3, 1] and a batch-1 input of shape [2, 2]
    assert batch_input_values(Kind.BATCH_ITEM_SHAPE, [[2, 3, 1], [1, 2, 2]]) == ([3, 2], [3, 1, 3, 1, 2, 2])
    assert batch_input_values(Kind.BATCH_ITEM_SHAPE_FLATTEN, [[2, 3, 1], [1, 2, 2]]) == ([6], [3, 1, 3, 1, 2, 2])


def ragged_onnx(path) -> None:
    """OUT = INPUT * 2 over the ragged INPUT; ENDS = INDEX, the accumulated element counts."""
    graph = helper.make_graph(
        [helper.make_node("Add", ["INPUT", "INPUT"], ["OUT"]), helper.make_node("Identity", ["INDEX"], ["ENDS"])],
        "ragged", [helper.make_tensor_value_info("INPUT", TensorProto.FLOAT, ["T"]),
                   helper.make_tensor_value_info("INDEX", TensorProto.FLOAT, ["B"])],
        [helper.make_tensor_value_info("OUT", TensorProto.FLOAT, ["T"]),
         helper.make_tensor_value_info("ENDS", TensorProto.FLOAT, ["B"])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    write(model, str(path))


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("ragged")
    ragged_onnx(root / "ragged" / "1" / "model.onnx")
    (root / "ragged" / "config.pbtxt").write_text(CONFIG)
    with serving([root], [], tmp_path_factory) as s:
        yield s


def test_requests_of_different_lengths_run_as_one_batch(server):
    answers = {}

    def send(length):
        x = np.arange(length, dtype=np.float32).reshape(1, length)
        inp = httpclient.InferInput("INPUT", [1, length], "FP32")
        inp.set_data_from_numpy(x)
        result = httpclient.InferenceServerClient(server.url).infer("ragged", [inp])
        answers[length] = (result.as_numpy("OUT"), result.as_numpy("ENDS").tolist())

    pending = 'nv_inference_pending_request_count{model="ragged",version="1"}'
    threads = []
    for n, length in enumerate((3, 4, 5), 1):  # one after another into the queue: the batch's order
        threads.append(threading.Thread(target=send, args=(length,)))
        threads[-1].start()
        if n < 3:
            server.wait_until(lambda n=n: scrape_metrics(server).get(pending) == n, 30, f"{n} queued")
    for thread in threads:
        thread.join(60)
    for length, ends in ((3, 3), (4, 7), (5, 12)):
        out, seen = answers[length]
        assert out.shape == (1, length) and out.tolist() == [[2.0 * i for i in range(length)]]
        assert seen == [[float(ends)]]
    stats = httpclient.InferenceServerClient(server.url).get_inference_statistics("ragged")["model_stats"][0]
    assert stats["execution_count"] == 1 and stats["inference_count"] == 3


def test_ragged_configs_triton_would_refuse_are_refused(tmp_path):
    import subprocess

    write_model(tmp_path, "py_batch_input", "", 'backend: "python"\nmax_batch_size: 4\n'
                'input [ { name: "X", data_type: TYPE_FP32, dims: [ -1 ], allow_ragged_batch: true } ]\n'
                'batch_input [ { kind: BATCH_ELEMENT_COUNT, target_name: "N", data_type: TYPE_INT32, '
                'source_input: "X" } ]\noutput [ { name: "Y", data_type: TYPE_FP32, dims: [ -1 ] } ]\n')
    write_model(tmp_path, "bad_source", "", 'backend: "python"\nmax_batch_size: 4\n'
                'input [ { name: "X", data_type: TYPE_FP32, dims: [ -1 ] } ]\n'
                'batch_input [ { kind: BATCH_ELEMENT_COUNT, target_name: "N", data_type: TYPE_INT64, '
                'source_input: "Z" } ]\noutput [ { name: "Y", data_type: TYPE_FP32, dims: [ -1 ] } ]\n')
    out = subprocess.run([*TRITONMP, "check", str(tmp_path)], capture_output=True, text=True, timeout=120).stdout
    assert "py_batch_input/config.pbtxt: batch_input: the python backend takes a batch's requests one by one" in out
    assert "bad_source/config.pbtxt: batch_input[0].data_type: must be TYPE_INT32 or TYPE_FP32" in out
    assert "bad_source/config.pbtxt: batch_input[0].source_input: must name one of the model's inputs" in out
