"""The whole-server test repository: a model of every kind side by side, so that every endpoint is
walked with all of them loaded (tests/test_whole_server.py). A new kind of model or path joins here,
with a probe: a request it answers and what the answer must be.

Kinds: ONNX, ONNX with reshaped tensors, ONNX with a ragged input, batch input and batch output,
python, BLS, decoupled, sequence, ensemble, classification, each CPU framework
(OpenVINO, TensorFlow, PyTorch), a model without inputs (with a readiness check of its own), a model
that fails to load and one that crash-loops once asked to."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from conftest import TEST_MODELS, write_model

ONES = np.ones((1, 3), np.float32)


@dataclass
class Probe:
    """A request a model answers (inputs by name) and a check of its outputs (by name)."""

    inputs: dict[str, np.ndarray]
    check: Callable[[dict[str, np.ndarray]], None]
    stream: bool = False  # decoupled: over the gRPC stream, its responses' outputs concatenated
    sequence: bool = False  # sent as a one-request sequence (start and end)
    outputs: list[str] = field(default_factory=list)  # the outputs checked (all the model's otherwise)


def _equal(name: str, want) -> Callable[[dict[str, np.ndarray]], None]:
    def check(outputs: dict[str, np.ndarray]) -> None:
        np.testing.assert_array_equal(outputs[name], want)
    return check


PIPELINE = '''
platform: "ensemble"
max_batch_size: 8
input [ { name: "IN_A", data_type: TYPE_FP32, dims: [ 3 ] }, { name: "IN_B", data_type: TYPE_FP32, dims: [ 3 ] } ]
output [ { name: "DOUBLED", data_type: TYPE_FP32, dims: [ 3 ] } ]
ensemble_scheduling {
  step [
    { model_name: "add", model_version: -1, input_map { key: "A" value: "IN_A" }
      input_map { key: "B" value: "IN_B" } output_map { key: "C" value: "SUM" } },
    { model_name: "add_py", model_version: -1, input_map { key: "A" value: "SUM" }
      input_map { key: "B" value: "SUM" } output_map { key: "C" value: "DOUBLED" } }
  ]
}
'''

# no inputs at all: what a generator or a health-check model looks like, with its own is_ready()
GENERATOR_PY = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("TICKET", np.array([42], np.int64))]) for _ in requests]

    async def is_ready(self):  # its own readiness check, asked by every model and strict server readiness check
        return True
'''

BROKEN_PY = '''
class TritonPythonModel:
    def initialize(self, args):
        raise RuntimeError("this model never loads")

    def execute(self, requests):
        return []
'''

# Loads once; any later start of its worker dies, so a request that kills it (X < 0) sends it into a
# crash loop that ends with the model UNAVAILABLE.
CRASHLOOP_PY = '''
import os
import signal

import numpy as np
import triton_python_backend_utils as pb_utils

HERE = os.path.dirname(__file__)


class TritonPythonModel:
    def initialize(self, args):
        marker = os.path.join(HERE, "started")
        if os.path.exists(marker):
            os._exit(3)
        open(marker, "w").close()

    def execute(self, requests):
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "X").as_numpy()
            if (x < 0).any():
                os.kill(os.getpid(), signal.SIGKILL)
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", x)]))
        return out
'''


def build(root: Path, example_repo: Path) -> dict[str, Probe | None]:
    """Every kind of model in `root`: name -> its probe (None for the model that never loads)."""
    from test_openvino import _ir
    from test_pytorch import _addsub_repo
    from test_tensorflow import GRAPHDEF_CONFIG, _frozen_graphdef

    from make_example_repo import binary_op_model

    root.mkdir(parents=True)
    for name in ("add", "add_py"):
        shutil.copytree(example_repo / name, root / name)
    for name in ("bls", "repeat", "accumulate", "scores"):
        shutil.copytree(TEST_MODELS / name, root / name)
    (root / "pipeline" / "1").mkdir(parents=True)
    (root / "pipeline" / "config.pbtxt").write_text(PIPELINE)
    from test_ragged import CONFIG as RAGGED_CONFIG
    from test_ragged import ragged_onnx

    ragged_onnx(root / "ragged" / "1" / "model.onnx")
    (root / "ragged" / "config.pbtxt").write_text(RAGGED_CONFIG.replace(
        "preferred_batch_size: [ 3 ], max_queue_delay_microseconds: 10000000", ""))
    shutil.copytree(example_repo / "add" / "1", root / "add_reshaped" / "1")
    (root / "add_reshaped" / "config.pbtxt").write_text(
        'platform: "onnxruntime_onnx"\nmax_batch_size: 8\ndynamic_batching { }\n'
        'input [ { name: "A", data_type: TYPE_FP32, dims: [ 3, 1 ], reshape: { shape: [ 3 ] } },\n'
        '        { name: "B", data_type: TYPE_FP32, dims: [ 3 ] } ]\n'
        'output [ { name: "C", data_type: TYPE_FP32, dims: [ 1, 3 ], reshape: { shape: [ 3 ] } } ]\n')

    scratch = root.parent / "scratch"
    scratch.mkdir()
    _ir(binary_op_model("Add"), root / "ov_add" / "1", scratch)
    (root / "ov_add" / "config.pbtxt").write_text(
        'backend: "openvino"\nmax_batch_size: 8\n'
        'input [ { name: "A", data_type: TYPE_FP32, dims: [ 3 ] }, { name: "B", data_type: TYPE_FP32, dims: [ 3 ] } ]\n'
        'output [ { name: "C", data_type: TYPE_FP32, dims: [ 3 ] } ]\n')
    (root / "tf_graphdef" / "1").mkdir(parents=True)
    _frozen_graphdef(root / "tf_graphdef" / "1" / "model.graphdef")
    (root / "tf_graphdef" / "config.pbtxt").write_text(GRAPHDEF_CONFIG)
    shutil.copytree(_addsub_repo(scratch, "instance_group [ { kind: KIND_CPU } ]\n") / "addsub", root / "torch_addsub")

    write_model(root, "generator", GENERATOR_PY, 'backend: "python"\nmax_batch_size: 0\n'
                'output [ { name: "TICKET", data_type: TYPE_INT64, dims: [ 1 ] } ]\n')
    write_model(root, "broken", BROKEN_PY, 'backend: "python"\nmax_batch_size: 0\n'
                'input [ { name: "X", data_type: TYPE_FP32, dims: [ 1 ] } ]\n'
                'output [ { name: "Y", data_type: TYPE_FP32, dims: [ 1 ] } ]\n')
    write_model(root, "crashloop", CRASHLOOP_PY, 'backend: "python"\nmax_batch_size: 0\n'
                'input [ { name: "X", data_type: TYPE_FP32, dims: [ 1 ] } ]\n'
                'output [ { name: "Y", data_type: TYPE_FP32, dims: [ 1 ] } ]\n')

    row = np.arange(3, dtype=np.float32).reshape(1, 3)
    return {
        "add": Probe({"A": row, "B": ONES}, _equal("C", row + 1)),
        "add_py": Probe({"A": row, "B": ONES}, _equal("C", row + 1)),
        "bls": Probe({"A": row, "TARGET": np.array([b"add"], dtype=object)}, _equal("C", (row + row) * 2)),
        "repeat": Probe({"N": np.array([3], np.int32)}, _equal("I", [0, 1, 2]), stream=True),
        "accumulate": Probe({"X": np.array([[5]], np.int32)}, _equal("SUM", [[5]]), sequence=True,
                            outputs=["SUM"]),
        "scores": Probe({"X": np.array([[1, 3, 2, 0]], np.float32)}, _equal("Y", [[1, 3, 2, 0]])),
        "pipeline": Probe({"IN_A": row, "IN_B": ONES}, _equal("DOUBLED", (row + 1) * 2)),
        "ragged": Probe({"INPUT": row}, lambda out: (_equal("OUT", row * 2)(out), _equal("ENDS", [[3.0]])(out))),
        "add_reshaped": Probe({"A": row.reshape(1, 3, 1), "B": ONES}, _equal("C", (row + 1).reshape(1, 1, 3))),
        "ov_add": Probe({"A": row, "B": ONES}, _equal("C", row + 1)),
        "tf_graphdef": Probe({"x": row}, _equal("y", row * 2 + 1)),
        "torch_addsub": Probe({"INPUT__0": row, "INPUT__1": ONES}, _equal("OUTPUT__0", row + 1)),
        "generator": Probe({}, _equal("TICKET", [42])),
        "crashloop": Probe({"X": np.array([2.0], np.float32)}, _equal("Y", [2.0])),
        "broken": None,
    }
