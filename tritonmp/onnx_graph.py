"""Read an ONNX model's inputs and outputs, complete a config from them, and check a config
against them. Uses the `onnx` protobuf reader only; no runtime is loaded in the frontend."""

from __future__ import annotations

from dataclasses import dataclass

from tritonclient.grpc import model_config_pb2 as mc

# onnx.TensorProto.DataType value -> Triton config type
_ONNX_TO_CONFIG = {
    1: mc.TYPE_FP32, 2: mc.TYPE_UINT8, 3: mc.TYPE_INT8, 4: mc.TYPE_UINT16, 5: mc.TYPE_INT16,
    6: mc.TYPE_INT32, 7: mc.TYPE_INT64, 8: mc.TYPE_STRING, 9: mc.TYPE_BOOL, 10: mc.TYPE_FP16,
    11: mc.TYPE_FP64, 12: mc.TYPE_UINT32, 13: mc.TYPE_UINT64, 16: mc.TYPE_BF16,
}
DEFAULT_MAX_BATCH_SIZE = 4  # what Triton's auto-complete picks for a batchable ONNX model


@dataclass
class GraphTensor:
    name: str
    data_type: int  # a ModelConfig DataType value, TYPE_INVALID when Triton has no such type
    shape: list[int] | None  # -1 for a symbolic or unknown dimension; None when the rank is unknown


def _tensor(value_info) -> GraphTensor:
    ttype = value_info.type.tensor_type
    data_type = _ONNX_TO_CONFIG.get(ttype.elem_type, mc.TYPE_INVALID)
    if not ttype.HasField("shape"):
        return GraphTensor(value_info.name, data_type, None)
    dims = [d.dim_value if d.HasField("dim_value") else -1 for d in ttype.shape.dim]
    return GraphTensor(value_info.name, data_type, dims)


def read_io(path: str) -> tuple[list[GraphTensor], list[GraphTensor]]:
    """The graph's real inputs (initializers excluded) and outputs. ValueError if unreadable."""
    import onnx

    try:
        model = onnx.load(path, load_external_data=False)
    except Exception as e:  # onnx raises DecodeError, OSError, ...
        raise ValueError(f"cannot read the ONNX model: {e}") from None
    initializers = {t.name for t in model.graph.initializer}
    inputs = [_tensor(v) for v in model.graph.input if v.name not in initializers]
    outputs = [_tensor(v) for v in model.graph.output]
    return inputs, outputs


def _batchable(graph) -> bool:
    tensors = graph[0] + graph[1]
    return bool(tensors) and all(t.shape and t.shape[0] == -1 for t in tensors)


def complete(config: mc.ModelConfig, graph) -> None:
    """Fill missing inputs, outputs and max_batch_size from the graph, as Triton's ONNX Runtime
    backend does."""
    inputs, outputs = graph
    if config.input and config.output:
        return
    if config.max_batch_size == 0 and _batchable(graph):
        config.max_batch_size = DEFAULT_MAX_BATCH_SIZE
        if not config.HasField("dynamic_batching"):
            config.dynamic_batching.SetInParent()
    skip = 1 if config.max_batch_size > 0 else 0
    for target, tensors in ((config.input, inputs), (config.output, outputs)):
        if target:
            continue
        for t in tensors:
            entry = target.add()
            entry.name = t.name
            entry.data_type = t.data_type
            if t.shape is not None:
                entry.dims.extend(t.shape[skip:] or [1])



def _fmt(dims) -> str:
    return "[" + ",".join(str(d) for d in dims) + "]"


def check(config: mc.ModelConfig, graph, path: str) -> list:
    """Problems between the config and the ONNX graph: unknown names, types, ranks, sizes."""
    from .config import ConfigProblem

    problems = []
    batched = config.max_batch_size > 0
    for kind, declared, actual in (("input", config.input, graph[0]), ("output", config.output, graph[1])):
        by_name = {t.name: t for t in actual}
        for i, t in enumerate(declared):
            field = f"{kind}[{i}]"
            g = by_name.get(t.name)
            if g is None:
                problems.append(ConfigProblem(path, field + ".name", f"'{t.name}' is not an {kind} of the "
                                              f"ONNX model; its {kind}s are: " + ", ".join(by_name)))
                continue
            if g.data_type != mc.TYPE_INVALID and t.data_type != g.data_type:
                problems.append(ConfigProblem(
                    path, field + ".data_type", f"{mc.DataType.Name(t.data_type)} for '{t.name}', but the "
                    f"ONNX model has {mc.DataType.Name(g.data_type)}"))
            if g.shape is None:
                continue
            full = ([-1] if batched else []) + list(t.dims)
            if len(full) != len(g.shape):
                hint = ""
                if batched and len(t.dims) == len(g.shape):
                    hint = (f"; dims exclude the batch dimension when max_batch_size > 0, so use "
                            f"dims: {_fmt(g.shape[1:])}")
                elif not batched and len(t.dims) + 1 == len(g.shape):
                    hint = "; with max_batch_size 0, dims must include the batch dimension"
                problems.append(ConfigProblem(
                    path, field + ".dims",
                    f"{_fmt(t.dims)} for '{t.name}' with max_batch_size {config.max_batch_size} gives "
                    f"{len(full)} dimensions {_fmt(full)}, but the ONNX model's '{t.name}' has "
                    f"{len(g.shape)} dimensions {_fmt(g.shape)}{hint}"))
                continue
            if batched and g.shape[0] != -1:
                problems.append(ConfigProblem(
                    path, "max_batch_size", f"{config.max_batch_size}, but the ONNX model's '{t.name}' has a "
                    f"fixed first dimension {g.shape[0]}, so it cannot take a batch; set max_batch_size: 0 "
                    f"and give the full shape in dims"))
                continue
            for want, have in zip(full, g.shape):
                if want != -1 and have != -1 and want != have:
                    problems.append(ConfigProblem(
                        path, field + ".dims", f"{_fmt(t.dims)} for '{t.name}' does not match the ONNX "
                        f"model's shape {_fmt(g.shape)}"))
                    break
    return problems
