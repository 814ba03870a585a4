"""A model's own inputs and outputs, as its framework describes them: completing a config from
them (Triton's auto-complete) and checking a config against them. Framework-neutral: the ONNX
reader in the frontend and the framework backends in workers both hand their tensors here."""

from __future__ import annotations

from dataclasses import dataclass

from tritonclient.grpc import model_config_pb2 as mc

from .problems import ConfigProblem

DEFAULT_MAX_BATCH_SIZE = 4  # Triton's default-max-batch-size, which its auto-complete picks

@dataclass
class GraphTensor:
    name: str
    data_type: int  # a ModelConfig DataType value, TYPE_INVALID when Triton has no such type
    shape: list[int] | None  # -1 for a symbolic or unknown dimension; None when the rank is unknown


def from_specs(specs: list[dict]) -> list[GraphTensor]:
    """GraphTensors from [{'name', 'datatype' (a Triton name such as FP32), 'shape' (or None)}]."""
    from .. import datatypes

    out = []
    for s in specs:
        try:
            data_type = mc.DataType.Value(datatypes.to_config(s["datatype"]))
        except ValueError:
            data_type = mc.TYPE_INVALID
        out.append(GraphTensor(s["name"], data_type, None if s.get("shape") is None else list(s["shape"])))
    return out


def batchable(graph) -> bool:
    """Every tensor has a variable first dimension and more after it (a tensor that is only the
    batch dimension would need a reshape, which auto-complete does not add: such a model is served
    unbatched, its dims [-1])."""
    tensors = graph[0] + graph[1]
    return bool(tensors) and all(t.shape and len(t.shape) > 1 and t.shape[0] == -1 for t in tensors)


def complete(config: mc.ModelConfig, graph, max_batch_size: int = DEFAULT_MAX_BATCH_SIZE) -> None:
    """Fill missing inputs, outputs and max_batch_size from the model's tensors, as Triton's
    framework backends do: a model whose every tensor has a variable first dimension batches, with
    max_batch_size 4 (or the largest batch the model itself allows, as a TensorRT engine's profiles
    say) and, unless it is a sequence model, dynamic batching."""
    inputs, outputs = graph
    if config.input and config.output:
        return
    if config.max_batch_size == 0 and batchable(graph) and max_batch_size > 0:
        config.max_batch_size = max_batch_size
        if not config.HasField("dynamic_batching") and not config.HasField("sequence_batching"):
            config.dynamic_batching.SetInParent()
    skip = 1 if config.max_batch_size > 0 else 0
    states = {n for s in config.sequence_batching.state for n in (s.input_name, s.output_name)}
    for target, tensors in ((config.input, inputs), (config.output, outputs)):
        if target:
            continue
        for t in tensors:
            if t.name in states:  # implicit state: the server gives and keeps it, clients never see it
                continue
            entry = target.add()
            entry.name = t.name
            entry.data_type = t.data_type
            if t.shape is not None:
                entry.dims.extend(t.shape[skip:] or [1])  # a scalar: Triton's [1]


def _fmt(dims) -> str:
    return "[" + ",".join(str(d) for d in dims) + "]"


def check(config: mc.ModelConfig, graph, path: str, what: str = "ONNX model", all_inputs: bool = False,
          reshapable: bool = False, input_dims_free: bool = False) -> list:
    """Problems between the config and the model's tensors: unknown names, types, ranks, sizes.
    `what` names the model in messages ("ONNX model", "OpenVINO model", ...); with `all_inputs`,
    an input of the model the config leaves out is a problem too (the framework needs every one).
    `reshapable`: the framework can make a fixed first dimension the batch dimension (OpenVINO);
    `input_dims_free`: the inputs take the config's dims whatever the model says (OpenVINO's
    RESHAPE_IO_LAYERS), so only their rank must agree."""
    problems = []
    batched = config.max_batch_size > 0
    scattered = {name for b in config.batch_output for name in b.target_name}
    for kind, declared, actual in (("input", config.input, graph[0]), ("output", config.output, graph[1])):
        by_name = {t.name: t for t in actual}
        for i, t in enumerate(declared):
            field = f"{kind}[{i}]"
            g = by_name.get(t.name)
            if g is None:
                problems.append(ConfigProblem(path, field + ".name", f"'{t.name}' is not an {kind} of the "
                                              f"{what}; its {kind}s are: " + ", ".join(by_name)))
                continue
            if g.data_type != mc.TYPE_INVALID and t.data_type != g.data_type:
                problems.append(ConfigProblem(
                    path, field + ".data_type", f"{mc.DataType.Name(t.data_type)} for '{t.name}', but the "
                    f"{what} has {mc.DataType.Name(g.data_type)}"))
            if g.shape is None:
                continue
            shape: list[int] = g.shape
            if getattr(t, "allow_ragged_batch", False) or (kind == "output" and t.name in scattered):
                if len(shape) != 1:  # its requests' elements one after another
                    problems.append(ConfigProblem(path, field + ".dims", f"'{t.name}' is ragged, so the {what} "
                                                  f"takes it as one dimension, but it has {len(shape)}"))
                continue
            # what the model sees: the reshape where the config gives one
            reshaped = t.HasField("reshape")
            dims = list(t.reshape.shape) if reshaped else list(t.dims)
            field += ".reshape.shape" if reshaped else ".dims"
            full = ([-1] if batched else []) + dims
            if len(full) != len(shape):
                hint = ""
                if batched and len(dims) == len(shape):
                    hint = (f"; dims exclude the batch dimension when max_batch_size > 0, so use "
                            f"dims: {_fmt(shape[1:])}")
                elif not batched and len(dims) + 1 == len(shape):
                    hint = "; with max_batch_size 0, dims must include the batch dimension"
                problems.append(ConfigProblem(
                    path, field,
                    f"{_fmt(dims)} for '{t.name}' with max_batch_size {config.max_batch_size} gives "
                    f"{len(full)} dimensions {_fmt(full)}, but the {what}'s '{t.name}' has "
                    f"{len(shape)} dimensions {_fmt(shape)}{hint}"))
                continue
            if input_dims_free and kind == "input":
                continue
            if batched and reshapable:
                shape = [-1] + shape[1:]
            if batched and shape[0] != -1:
                problems.append(ConfigProblem(
                    path, "max_batch_size", f"{config.max_batch_size}, but the {what}'s '{t.name}' has a "
                    f"fixed first dimension {shape[0]}, so it cannot take a batch; set max_batch_size: 0 "
                    f"and give the full shape in dims"))
                continue
            for want, have in zip(full, shape):
                if want != -1 and have != -1 and want != have:
                    problems.append(ConfigProblem(
                        path, field, f"{_fmt(dims)} for '{t.name}' does not match the "
                        f"{what}'s shape {_fmt(shape)}"))
                    break
    if all_inputs:  # a state's input is the server's to give
        declared = {t.name for t in config.input} | {s.input_name for s in config.sequence_batching.state} \
            | {name for b in config.batch_input for name in b.target_name}  # made by the server too
        missing = [t.name for t in graph[0] if t.name not in declared]
        if missing:
            problems.append(ConfigProblem(path, "input", f"the {what} also takes " + ", ".join(
                f"'{n}'" for n in missing) + "; list every input it takes"))
    return problems
