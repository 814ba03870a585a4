"""Triton's generate extension (`/v2/models/NAME/generate` and `generate_stream`): a flat JSON
object whose keys name the model's inputs, answered by a flat JSON object of its outputs (one
per response, as server-sent events on the stream)."""

from __future__ import annotations

import numpy as np

from . import datatypes
from .core import InferRequest, InferResponse, Tensor
from .errors import invalid

RESERVED = ("id", "parameters")


def decode(doc: dict, model: str, version: str, inputs: dict, max_batch_size: int) -> InferRequest:
    """A generate request body as a core request: each key that names an input becomes that input,
    shaped as the configuration says (a batch of one when the model batches)."""
    tensors = []
    for name, cfg in inputs.items():
        if name not in doc:
            if cfg.optional:
                continue
            raise invalid(f"generate request for model '{model}' has no value for input '{name}'")
        value = doc[name]
        values = value if isinstance(value, list) else [value]
        shape = [len(values) if d == -1 else d for d in cfg.dims]
        count = datatypes.element_count(shape)
        if count != len(values):
            if len(shape) == 1 and cfg.dims[0] == -1:
                shape = [len(values)]
            else:
                raise invalid(f"input '{name}' needs {count} value(s) for its shape {list(cfg.dims)}, got "
                              f"{len(values)}")
        try:
            if cfg.datatype == "BYTES":
                data = datatypes.serialize_bytes(np.array([str(v).encode() if not isinstance(v, bytes) else v
                                                           for v in values], dtype=object))
            else:
                data = np.asarray(values, dtype=datatypes.NUMPY_OF[cfg.datatype]).tobytes()
        except (TypeError, ValueError) as e:
            raise invalid(f"input '{name}': {e}") from None
        if max_batch_size > 0:
            shape = [1, *shape]
        tensors.append(Tensor(name, cfg.datatype, shape, data))
    unknown = [k for k in doc if k not in inputs and k not in RESERVED]
    if unknown:
        raise invalid(f"generate request for model '{model}' names unknown input(s): {', '.join(unknown)}")
    parameters = doc.get("parameters") or {}
    if not isinstance(parameters, dict):
        raise invalid("'parameters' must be a JSON object")
    request_id = doc.get("id", "")
    return InferRequest(model, version, request_id if isinstance(request_id, str) else str(request_id), tensors,
                        None, dict(parameters))


def encode(response: InferResponse) -> dict:
    """A response as generate's flat object: a scalar for a one-element output, else a list."""
    out = {"model_name": response.model_name, "model_version": response.model_version}
    if response.id:
        out["id"] = response.id
    for t in response.outputs:
        if t.data is None:
            continue
        if t.datatype == "BYTES":
            values = [b.decode("utf-8", errors="replace") for b in datatypes.deserialize_bytes(t.data)]
        else:
            array = np.frombuffer(t.data, dtype=datatypes.NUMPY_OF[t.datatype])
            values = (array.astype(np.float32) if t.datatype == "BF16" else array).tolist()
        out[t.name] = values[0] if len(values) == 1 else values
    return out
