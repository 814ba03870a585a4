"""Ragged batching, as Triton's framework backends do it: an input with `allow_ragged_batch` joins a
batch whatever its shape and reaches the model as one 1-dimensional tensor, the requests' elements
one after another; `batch_input` gives the model what it needs to tell them apart (element counts,
their running sums, the largest count as a shape, each row's shape), made once the batch is formed;
`batch_output` BATCH_SCATTER_WITH_INPUT_SHAPE hands each request its part of an output in the shape
of its source input. Only batches merged into one set of tensors (every backend but python) are
ragged: a python model takes its requests one by one."""

from __future__ import annotations

import math

import numpy as np
from tritonclient.grpc import model_config_pb2 as mc

from .. import backends

Kind = mc.BatchInput.Kind

_DTYPES = {mc.TYPE_INT32: ("INT32", np.int32), mc.TYPE_FP32: ("FP32", np.float32)}


def batch_input_values(kind: int, shapes: list[list[int]]) -> tuple[list[int], list]:
    """(shape, values) of a batch input of `kind` whose source input has `shapes` in the batch's
    requests (each with its batch dimension first)."""
    counts = [math.prod(s) for s in shapes]
    if kind == Kind.BATCH_ELEMENT_COUNT:
        return [len(counts)], counts
    if kind == Kind.BATCH_ACCUMULATED_ELEMENT_COUNT:
        return [len(counts)], list(np.cumsum(counts))
    if kind == Kind.BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO:
        return [len(counts) + 1], [0, *np.cumsum(counts)]
    if kind == Kind.BATCH_MAX_ELEMENT_COUNT_AS_SHAPE:  # a shape: its size says it, its values are not read
        largest = max(counts)
        return [largest], [0] * largest
    rows = [list(s[1:]) for s in shapes for _ in range(s[0] if s else 1)]  # each row's own shape
    rank = len(rows[0]) if rows else 0
    flat = [d for row in rows for d in row]
    if kind == Kind.BATCH_ITEM_SHAPE:
        return [len(rows), rank], flat
    if kind == Kind.BATCH_ITEM_SHAPE_FLATTEN:
        return [len(rows) * rank], flat
    raise ValueError(f"batch input kind {kind} is not known")


class Ragged:
    """The ragged inputs, batch inputs and batch outputs of one model version: None from `of` when it
    has none."""

    __slots__ = ("inputs", "batch_inputs", "scatter")

    def __init__(self, config: mc.ModelConfig):
        self.inputs = {t.name for t in config.input if t.allow_ragged_batch}
        # (target name, datatype, numpy type, kind, source input)
        self.batch_inputs = [(target, *_DTYPES[b.data_type], b.kind, b.source_input[0])
                             for b in config.batch_input for target in b.target_name]
        # output name -> the input whose shape each request's part takes
        self.scatter = {target: b.source_input[0] for b in config.batch_output for target in b.target_name
                        if b.kind == mc.BatchOutput.Kind.BATCH_SCATTER_WITH_INPUT_SHAPE}

    @classmethod
    def of(cls, config: mc.ModelConfig) -> Ragged | None:
        ragged = cls(config)
        return ragged if ragged.inputs or ragged.batch_inputs or ragged.scatter else None

    def made(self, shapes: dict[str, list[list[int]]]) -> list[tuple[str, str, list[int], bytes]]:
        """The batch inputs of a batch whose inputs have `shapes` (name -> each request's shape):
        (name, datatype, shape, bytes) each."""
        out = []
        for target, datatype, dtype, kind, source in self.batch_inputs:
            shape, values = batch_input_values(kind, shapes[source])
            out.append((target, datatype, shape, np.asarray(values, dtype).tobytes()))
        return out


def problems(config: mc.ModelConfig, runner: str) -> list[tuple[str, str]]:
    """(field, problem) of a config's ragged batching, as Triton would refuse it; `runner`: the backend
    that runs the model."""
    out = []
    inputs = {t.name for t in config.input}
    if (config.batch_input or config.batch_output) and backends.one_by_one(runner):
        out.append(("batch_input" if config.batch_input else "batch_output", f"the {runner} backend takes a "
                    "batch's requests one by one, so it has no batch inputs or outputs; read each request's own "
                    "tensors"))
    for i, b in enumerate(config.batch_input):
        field = f"batch_input[{i}]"
        if b.data_type not in _DTYPES:
            out.append((field + ".data_type", "must be TYPE_INT32 or TYPE_FP32"))
        if len(b.source_input) != 1 or b.source_input[0] not in inputs:
            out.append((field + ".source_input", "must name one of the model's inputs"))
        if not b.target_name or any(t in inputs for t in b.target_name):
            out.append((field + ".target_name", "must name the model inputs the server makes, which are not "
                        "listed as inputs"))
    for i, b in enumerate(config.batch_output):
        if len(b.source_input) != 1 or b.source_input[0] not in inputs:
            out.append((f"batch_output[{i}].source_input", "must name one of the model's inputs"))
    return out
