"""The whole-server test repository: a model of every kind side by side, so that every endpoint is
walked with all of them loaded (tests/test_whole_server.py). A new kind of model or path joins here,
with a probe: a request it answers and what the answer must be.

Kinds: ONNX, ONNX with reshaped tensors, ONNX with a ragged input, batch input and batch output,
python, BLS, decoupled, sequence, ensemble, classification, each CPU framework
(OpenVINO, TensorFlow, PyTorch), a model without inputs (with a readiness check of its own), a
python-based backend's model (tests/backends/tokens, decoupled, the vLLM backend's interface), a python
model in an environment of its own (EXECUTION_ENV_PATH, numpy 1), a model that fails to load and one
that crash-loops once asked to."""

from __future__ import annotations

import queue
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import orjson
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import np_to_triton_dtype

from conftest import NUMPY_1, NUMPY_REPORTER, TEST_MODELS, http_request, python_environment, scrape_metrics, write_model

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
    for name in ("bls", "repeat", "accumulate", "scores", "llm"):
        shutil.copytree(TEST_MODELS / name, root / name)
    write_model(root, "numpy1_env", NUMPY_REPORTER, 'backend: "python"\nmax_batch_size: 8\ndynamic_batching { }\n'
                'input [ { name: "X", data_type: TYPE_FP32, dims: [ -1 ] } ]\n'
                'output [ { name: "Y", data_type: TYPE_FP32, dims: [ -1 ] }, '
                '{ name: "NUMPY", data_type: TYPE_STRING, dims: [ 1 ] } ]\n'
                'parameters { key: "EXECUTION_ENV_PATH" value { string_value: "' + str(python_environment(NUMPY_1))
                + '" } }\n')
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
        "llm": Probe({"text_input": np.array([b"hi"], dtype=object), "stream": np.array([True]),
                      "sampling_parameters": np.array([b'{"max_tokens": 2}'], dtype=object)},
                     _equal("text_output", [b" the", b" quick"]), stream=True, outputs=["text_output"]),
        "numpy1_env": Probe({"X": np.array([[1.0, 2.0]], np.float32)},
                            lambda out: (_equal("Y", [[2.0, 4.0]])(out), _equal("NUMPY", [[NUMPY_1.encode()]])(out))),
        "crashloop": Probe({"X": np.array([2.0], np.float32)}, _equal("Y", [2.0])),
        "broken": None,
    }


def served(probes) -> list[str]:
    """The models that load and stay up (the crash-looping one is asked to crash by its own test)."""
    return [name for name, probe in probes.items() if probe is not None and name != "crashloop"]


def probe_inputs(module, probe: Probe) -> list:
    inputs = []
    for name, value in probe.inputs.items():
        tensor = module.InferInput(name, list(value.shape), np_to_triton_dtype(value.dtype))
        tensor.set_data_from_numpy(value)
        inputs.append(tensor)
    return inputs


def infer_probe(module, url: str, name: str, probe: Probe, seq: int) -> dict[str, np.ndarray]:
    """The probe's request over HTTP or gRPC: its outputs by name (a decoupled model's over a stream)."""
    if probe.stream:
        client = grpcclient.InferenceServerClient(url)
        answers: queue.Queue = queue.Queue()
        client.start_stream(callback=lambda result, error: answers.put((result, error)))
        try:
            client.async_stream_infer(name, probe_inputs(grpcclient, probe), enable_empty_final_response=True)
            parts: dict[str, list] = {}
            while True:
                result, error = answers.get(timeout=60)
                assert error is None, error
                response = result.get_response()
                for output in response.outputs:
                    parts.setdefault(output.name, []).append(result.as_numpy(output.name))
                if response.parameters["triton_final_response"].bool_param:
                    break
        finally:
            client.stop_stream()
        return {k: np.concatenate(v) for k, v in parts.items()}
    client = module.InferenceServerClient(url)
    kwargs = {"sequence_id": seq, "sequence_start": True, "sequence_end": True} if probe.sequence else {}
    outputs = [module.InferRequestedOutput(o) for o in probe.outputs] or None
    result = client.infer(name, probe_inputs(module, probe), outputs=outputs, **kwargs)
    response = result.get_response()
    names = [o["name"] for o in response["outputs"]] if module is httpclient else [o.name for o in response.outputs]
    return {n: result.as_numpy(n) for n in names}


def walk_observability(server, names: list[str]) -> None:
    """/metrics, the status page, /status.json and the statistics all answer, naming every model."""
    samples = scrape_metrics(server)
    for name in names:
        assert any(f'model="{name}"' in key for key in samples if key.startswith("nv_inference_request_success")), name
    status, headers, page = http_request(server.metrics_port, "GET", "/")
    assert status == 200 and headers["content-type"].startswith("text/html") and b"<html" in page.lower()
    status, _, body = http_request(server.metrics_port, "GET", "/status.json")
    assert status == 200, body
    listed = {m["name"] for m in orjson.loads(body)["models"]}
    assert set(names) <= listed, set(names) - listed
    http = httpclient.InferenceServerClient(server.url)
    stats = {s["name"] for s in http.get_inference_statistics()["model_stats"]}
    assert set(names) <= stats
    for name in names:
        assert http.get_inference_statistics(name)["model_stats"][0]["name"] == name
    grpc_stats = grpcclient.InferenceServerClient(server.grpc_url).get_inference_statistics()
    assert set(names) <= {s.name for s in grpc_stats.model_stats}
