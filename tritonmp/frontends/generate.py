"""Triton's generate extension (`/v2/models/NAME/generate` and `generate_stream`): a flat JSON
object whose keys name the model's inputs, answered by a flat JSON object of its outputs (one
per response, as server-sent events on the stream)."""

from __future__ import annotations

import json

import numpy as np

from .. import datatypes
from ..errors import ServerError, invalid
from ..inference import InferRequest, InferResponse, Tensor
from .http_codec import UNPARSABLE

RESERVED = ("id", "parameters")
PREFIX = "[request id: <id_unknown>] "


def parse(body: bytes) -> dict:
    """The request's JSON object; a key given twice is refused (Triton: the input "already exists"),
    not silently the last one."""
    def pairs_hook(pairs):
        doc = {}
        for key, value in pairs:
            if key in doc:
                raise invalid(f"{PREFIX}input '{key}' already exists in request")
            doc[key] = value
        return doc

    try:
        doc = json.loads(body, object_pairs_hook=pairs_hook)
    except ValueError as e:  # json.JSONDecodeError and friends
        raise invalid(f"{UNPARSABLE}: {e}") from None
    except RecursionError:
        raise invalid(f"{UNPARSABLE}: it is nested too deeply") from None
    if not isinstance(doc, dict):
        raise invalid("the request body must be a JSON object")
    return doc


def _tensor_data(name: str, datatype: str, values: list) -> bytes:
    """The values as the input's bytes; JSON values of another type are refused in Triton's words."""
    if datatype == "BYTES":
        if not all(isinstance(v, str) for v in values):
            raise invalid("Unable to parse JSON bytes array: attempt to access JSON non-string as string")
        return datatypes.serialize_bytes(np.array([v.encode() for v in values], dtype=object))
    if datatype == "BOOL":
        if not all(isinstance(v, bool) for v in values):
            raise invalid("Unable to parse 'data': attempt to access JSON non-boolean as boolean")
    elif not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
        raise invalid("Unable to parse 'data': attempt to access JSON non-number as double")
    try:
        return np.asarray(values, dtype=datatypes.NUMPY_OF[datatype]).tobytes()
    except (TypeError, ValueError, OverflowError) as e:
        raise invalid(f"input '{name}': {e}") from None


def _parameter(key: str, value):
    """A request parameter's value as Triton takes it from a generate request: a string, an integer or
    a boolean, in its words otherwise."""
    if isinstance(value, float) or not isinstance(value, (str, int, bool)):
        raise invalid(f"parameter '{key}' has invalid type. It should be either 'int', 'bool', or 'string'.")
    return value


def decode(doc: dict, model: str, version: str, inputs: dict, max_batch_size: int) -> InferRequest:
    """A generate request as a core request, as Triton reads it: each key that names an input
    becomes that input (shaped as the configuration says, a batch of one when the model batches);
    every other key is a request parameter (a string, integer or boolean) the model can read.
    Missing inputs are left to the request check, which counts them in Triton's words."""
    tensors = []
    parameters = {}
    for key, value in doc.items():
        if key in RESERVED:
            continue
        cfg = inputs.get(key)
        if cfg is None:
            parameters[key] = _parameter(key, value)
            continue
        values = value if isinstance(value, list) else [value]
        shape = [len(values) if d == -1 else d for d in cfg.dims]
        count = datatypes.element_count(shape)
        if count != len(values):
            if len(shape) == 1 and cfg.dims[0] == -1:
                shape = [len(values)]
            else:
                raise invalid(f"input '{key}' needs {count} value(s) for its shape {list(cfg.dims)}, got "
                              f"{len(values)}")
        data = _tensor_data(key, cfg.datatype, values)
        if max_batch_size > 0:
            shape = [1, *shape]
        tensors.append(Tensor(key, cfg.datatype, shape, data))
    given = doc.get("parameters", {})
    if not isinstance(given, dict):
        raise invalid("Expected JSON object for keyword: 'parameters': attempt to access JSON non-object as object")
    for key, value in given.items():
        try:
            parameters[key] = _parameter(key, value)
        except ServerError as e:
            raise invalid(f"Converting keyword: 'parameters': {e.message}") from None
    request_id = doc.get("id", "")
    return InferRequest(model, version, request_id if isinstance(request_id, str) else str(request_id), tensors,
                        None, parameters)


def encode(response: InferResponse) -> dict:
    """A response as generate's flat object: a scalar for a one-element output, else a list; the
    outputs first, then the model's name and version, in Triton's order."""
    out = {}
    for t in response.outputs:
        if t.data is None:
            continue
        if t.datatype == "BYTES":
            values = [b.decode("utf-8", errors="replace") for b in datatypes.deserialize_bytes(t.data)]
        else:
            array = np.frombuffer(t.data, dtype=datatypes.NUMPY_OF[t.datatype])
            values = (array.astype(np.float32) if t.datatype == "BF16" else array).tolist()
        out[t.name] = values[0] if len(values) == 1 else values
    out["model_name"] = response.model_name
    out["model_version"] = response.model_version
    if response.id:
        out["id"] = response.id
    return out
