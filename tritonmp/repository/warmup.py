"""Model warmup (Triton's model_warmup): the requests each instance runs before its model is
READY, built from zero data, random data or files in the model's warmup/ directory."""

from __future__ import annotations

import os

import numpy as np
from tritonclient.grpc import model_config_pb2 as mc

from .. import datatypes
from ..inference import InferRequest, Tensor
from .problems import ConfigProblem


def _data(name: str, datatype: str, dims: list[int], spec, model_dir: str, batch: int,
          rng: np.random.Generator) -> bytes:
    count = datatypes.element_count(dims)
    which = spec.WhichOneof("input_data_type")
    if datatype == "BYTES":
        if which == "input_data_file":
            with open(os.path.join(model_dir, "warmup", spec.input_data_file), "rb") as f:
                one = [f.read()] * count
        elif which == "random_data":
            one = [str(int(v)).encode() for v in rng.integers(0, 1 << 30, count)]
        else:
            one = [b""] * count
        return datatypes.serialize_bytes(np.array(one * batch, dtype=np.object_))
    dtype = datatypes.NUMPY_OF[datatype]
    if which == "input_data_file":
        with open(os.path.join(model_dir, "warmup", spec.input_data_file), "rb") as f:
            raw = f.read()
        want = count * dtype.itemsize
        if len(raw) != want:
            raise ValueError(f"warmup input '{name}': file '{spec.input_data_file}' holds {len(raw)} bytes, the "
                             f"input needs {want}")
        return raw * batch
    if which == "random_data":
        if datatype == "BOOL":
            array = rng.integers(0, 2, count * batch).astype(bool)
        elif dtype.kind in "iu":
            array = rng.integers(0, 100, count * batch).astype(dtype)
        else:
            array = rng.random(count * batch).astype(np.float32).astype(dtype)
        return array.reshape(-1).view(np.uint8).tobytes()
    return bytes(count * dtype.itemsize * batch)


def warmup_requests(config: mc.ModelConfig, model_dir: str) -> list[tuple[str, int, InferRequest]]:
    """(sample name, how many times to run it, the request) for each model_warmup entry."""
    rng = np.random.default_rng(0)
    out = []
    for sample in config.model_warmup:
        batch = max(1, sample.batch_size) if config.max_batch_size > 0 else 1
        inputs = []
        for name, spec in sample.inputs.items():
            datatype = datatypes.from_config(mc.DataType.Name(spec.data_type))
            dims = list(spec.dims)
            shape = ([batch] if config.max_batch_size > 0 else []) + dims
            inputs.append(Tensor(name, datatype, shape, _data(name, datatype, dims, spec, model_dir, batch, rng)))
        order = {t.name: i for i, t in enumerate(config.input)}
        inputs.sort(key=lambda t: order.get(t.name, len(order)))
        request = InferRequest(config.name, "", f"warmup:{sample.name}", inputs, None, {})
        request.batch_size = batch
        out.append((sample.name, max(1, sample.count), request))
    return out


def check(config: mc.ModelConfig, model_dir: str, path: str) -> list:
    """Problems of the model_warmup entries, found before any worker starts."""
    problems = []
    declared = {t.name: t for t in config.input}
    for i, sample in enumerate(config.model_warmup):
        field = f"model_warmup[{i}]"
        if config.max_batch_size > 0 and sample.batch_size > config.max_batch_size:
            problems.append(ConfigProblem(path, field + ".batch_size", f"{sample.batch_size} is over max_batch_size "
                                          f"{config.max_batch_size}"))
        missing = [n for n, t in declared.items() if not t.optional and n not in sample.inputs]
        if missing:
            problems.append(ConfigProblem(path, field + ".inputs", "no data for input(s) " + ", ".join(missing)))
        for name, spec in sample.inputs.items():
            if name not in declared:
                problems.append(ConfigProblem(path, f"{field}.inputs[{name}]",
                                              f"'{name}' is not an input of the model"))
                continue
            if spec.data_type != declared[name].data_type:
                problems.append(ConfigProblem(path, f"{field}.inputs[{name}].data_type",
                                              f"{mc.DataType.Name(spec.data_type)}, but the input is "
                                              f"{mc.DataType.Name(declared[name].data_type)}"))
            if any(d < 1 for d in spec.dims):
                problems.append(ConfigProblem(path, f"{field}.inputs[{name}].dims", "warmup dims must all be "
                                              "positive sizes"))
            if spec.WhichOneof("input_data_type") is None:
                problems.append(ConfigProblem(path, f"{field}.inputs[{name}]", "give zero_data, random_data or "
                                              "input_data_file"))
            elif spec.WhichOneof("input_data_type") == "input_data_file":
                file = os.path.join(model_dir, "warmup", spec.input_data_file)
                if not os.path.isfile(file):
                    problems.append(ConfigProblem(path, f"{field}.inputs[{name}].input_data_file",
                                                  f"'{spec.input_data_file}' is not a file in the model's warmup/ "
                                                  "directory"))
    return problems
