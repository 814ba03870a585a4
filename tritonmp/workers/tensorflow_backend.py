"""The TensorFlow backend (TF2, CPU): a SavedModel (`tensorflow_savedmodel`, a model.savedmodel
directory) run through one of its signatures, or a frozen GraphDef (`tensorflow_graphdef`, a
model.graphdef file) run in a session.

As in Triton's tensorflow backend: a SavedModel's inputs and outputs are named by its signature's
keys (the signature is `serving_default`, or the one the TF_SIGNATURE_DEF parameter names, under
the TF_GRAPH_TAG tag set, `serve` by default); a GraphDef's by its node names, and its config must
list them (a GraphDef does not say which nodes are outputs). BYTES tensors are tf.string.
TF_NUM_INTRA_THREADS and TF_NUM_INTER_THREADS set the thread pools of this instance's process.
"""

from __future__ import annotations

import os

import numpy as np

from tritonmp import datatypes
from tritonmp.ipc.transport import TensorSpec, WorkerSpec

from .backend import (
    Backend,
    BackendError,
    WorkRequest,
    WorkResponse,
    WorkTensor,
    check_io,
    model_path,
    param,
    tensor_dict,
)

DEFAULT_SIGNATURE = "serving_default"
DEFAULT_TAG = "serve"


def _import_tf():
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    try:
        import tensorflow as tf
    except ImportError:
        raise BackendError("the tensorflow backend needs the 'tensorflow' package: "
                           "pip install 'tritonmp[tensorflow]'") from None
    return tf


def _threads(config: dict, key: str) -> int:
    value = param(config, key).strip()
    if not value:
        return 0
    if not value.isdigit():
        raise BackendError(f"expected the parameter '{key}' to be a non-negative number, got {value}")
    return int(value)


def _datatype(dtype) -> str:
    if dtype.name == "string":
        return "BYTES"
    try:
        return datatypes.of_numpy(np.dtype(dtype.as_numpy_dtype))
    except (TypeError, ValueError, KeyError):
        return "INVALID"


def _shape(shape) -> list[int] | None:
    if shape.rank is None:
        return None
    return [-1 if d is None else int(d) for d in shape.as_list()]


_NOISE = ("Graph execution error:", "Detected at node", "<stack traces", "File ", "[[{{node")


def _first_line(e: Exception) -> str:
    """The line of a TensorFlow error that says what went wrong (its messages start with where)."""
    text = getattr(e, "message", None) or str(e)
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.strip().startswith(_NOISE)]
    line = lines[0] if lines else type(e).__name__
    return line.split(" [Op:")[0]


def _is_graphdef(config: dict) -> bool:
    return config.get("platform") == "tensorflow_graphdef"


def _signature(tf, path: str, config: dict):
    tag = param(config, "TF_GRAPH_TAG").strip() or DEFAULT_TAG
    name = param(config, "TF_SIGNATURE_DEF").strip() or DEFAULT_SIGNATURE
    try:
        loaded = tf.saved_model.load(path, tags=[tag])
    except Exception as e:  # tensorflow raises many kinds
        raise BackendError(f"TensorFlow cannot load the SavedModel: {_first_line(e)}") from None
    signatures = dict(loaded.signatures)
    if name not in signatures:
        raise BackendError(f"the SavedModel has no signature '{name}' (it has: {', '.join(signatures) or 'none'}); "
                           "name one with the TF_SIGNATURE_DEF parameter")
    fn = signatures[name]
    _, kwargs = fn.structured_input_signature
    inputs = [tensor_dict(k, _datatype(s.dtype), _shape(s.shape)) for k, s in sorted(kwargs.items())]
    outputs = [tensor_dict(k, _datatype(s.dtype), _shape(s.shape)) for k, s in sorted(fn.structured_outputs.items())]
    return loaded, fn, inputs, outputs


def _tensor_name(name: str) -> str:
    return name if ":" in name else name + ":0"


def _graph(tf, path: str, config: dict):
    graph_def = tf.compat.v1.GraphDef()
    try:
        with open(path, "rb") as f:
            graph_def.ParseFromString(f.read())
        graph = tf.Graph()
        with graph.as_default():
            tf.compat.v1.import_graph_def(graph_def, name="")
    except Exception as e:
        raise BackendError(f"TensorFlow cannot read the GraphDef: {_first_line(e)}") from None
    inputs = [tensor_dict(op.name, _datatype(op.outputs[0].dtype), _shape(op.outputs[0].shape))
              for op in graph.get_operations() if op.type in ("Placeholder", "PlaceholderWithDefault")
              and (op.type == "Placeholder" or op.name in {t["name"] for t in config.get("input", [])})]
    if not config.get("output"):
        raise BackendError("a GraphDef does not say which of its nodes are outputs: list every input and output "
                           "in config.pbtxt")
    outputs = []
    for t in config.get("output", []):
        try:
            tensor = graph.get_tensor_by_name(_tensor_name(t["name"]))
        except (KeyError, ValueError):
            continue  # reported by the config check, with the names there are
        outputs.append(tensor_dict(t["name"], _datatype(tensor.dtype), _shape(tensor.shape)))
    return graph, inputs, outputs


def describe(path: str, config: dict) -> tuple[list[dict], list[dict]]:
    """The model's inputs and outputs, for auto-complete."""
    tf = _import_tf()
    if _is_graphdef(config):
        _, inputs, outputs = _graph(tf, path, config)
    else:
        _, _, inputs, outputs = _signature(tf, path, config)
    return inputs, outputs


class TensorFlowBackend(Backend):
    def __init__(self, spec: WorkerSpec, config: dict):
        tf = _import_tf()
        self.tf = tf
        intra = _threads(config, "TF_NUM_INTRA_THREADS")
        inter = _threads(config, "TF_NUM_INTER_THREADS")
        if spec.kind == "GPU" and not tf.config.list_physical_devices("GPU"):
            raise BackendError("instance kind KIND_GPU needs a TensorFlow build with GPU support and a visible GPU")
        path = model_path(spec, config)
        self.graphdef = _is_graphdef(config)
        if self.graphdef:
            self.graph, inputs, outputs = _graph(tf, path, config)
            session_config = tf.compat.v1.ConfigProto(intra_op_parallelism_threads=intra,
                                                      inter_op_parallelism_threads=inter)
            self.session = tf.compat.v1.Session(graph=self.graph, config=session_config)
        else:
            # the process-wide pools: set before the first op runs (each instance is a process of its own)
            if intra:
                tf.config.threading.set_intra_op_parallelism_threads(intra)
            if inter:
                tf.config.threading.set_inter_op_parallelism_threads(inter)
            self.loaded, self.fn, inputs, outputs = _signature(tf, path, config)
        check_io(config, inputs, outputs)
        self.output_names = [t["name"] for t in config.get("output", [])]
        signature = param(config, "TF_SIGNATURE_DEF") or DEFAULT_SIGNATURE
        kind = "GraphDef" if self.graphdef else f"SavedModel signature '{signature}'"
        self.detail = (f"tensorflow {tf.__version__}, {kind}; intra-op threads {intra or 'auto'}, "
                       f"inter-op threads {inter or 'auto'}")

    def metadata(self) -> tuple[list[TensorSpec], list[TensorSpec]]:
        return [], []

    def execute(self, requests: list[WorkRequest]) -> list[WorkResponse]:
        (request,) = requests  # the frontend merges a batch into one request for this backend
        names = request.outputs or self.output_names
        try:
            if self.graphdef:
                feeds = {_tensor_name(t.name): t.array for t in request.inputs}
                values = self.session.run([_tensor_name(n) for n in names], feed_dict=feeds)
            else:
                tf = self.tf
                args = {t.name: tf.constant(t.array, dtype=tf.string if t.datatype == "BYTES" else None)
                        for t in request.inputs}
                result = self.fn(**args)
                values = [result[n].numpy() for n in names]
        except Exception as e:  # tf.errors.* and friends: the model failed on this batch
            raise BackendError(f"TensorFlow failed: {_first_line(e)}") from None
        outputs = []
        for name, value in zip(names, values):
            value = np.asarray(value)
            if value.dtype == np.object_ or value.dtype.kind in "SU":
                outputs.append(WorkTensor(name, "BYTES", value.astype(np.object_)))
            else:
                outputs.append(WorkTensor(name, datatypes.of_numpy(value.dtype), value))
        return [WorkResponse(outputs=outputs)]

    def finalize(self) -> None:
        if self.graphdef:
            self.session.close()
        self.fn = self.loaded = None
