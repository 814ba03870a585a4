"""KServe v2 JSON and Triton's binary tensor extension: HTTP bodies to core requests, core
responses to HTTP bodies."""

from __future__ import annotations

import array
import math
import zlib
from typing import Annotated, Any

import msgspec
import numpy as np
import orjson

from .. import datatypes, testing
from ..errors import ServerError, internal, invalid
from ..inference import InferRequest, InferResponse, RequestedOutput, Tensor
from .request_params import check_json_output, check_json_request, check_json_shared_memory, unsigned, wrong_json_type

LARGE_OUTPUT = 64 * 1024  # a binary output this large is written from its own buffer, never joined
_ITEMSIZE = datatypes.ITEMSIZE
_INT_ONLY = frozenset((int,))  # the one type of a shape's dimensions (JSON numbers: int, never bool)

# Datatypes whose flat JSON list of numbers the standard library's array packs in Triton's layout (this
# host's byte order and item size, both little-endian, checked at import), in half numpy's time for
# the small tensors JSON carries. Anything it does not take as it is (nested lists, strings, a float
# for an integer type, an integer out of range) is left to numpy, which accepts or words it as before.
_ARRAY_CODES = {name: code for name, code in (("FP32", "f"), ("FP64", "d"), ("INT8", "b"), ("INT16", "h"),
                                              ("INT32", "i"), ("INT64", "q"), ("UINT8", "B"), ("UINT16", "H"),
                                              ("UINT32", "I"), ("UINT64", "Q"))
                if array.array(code).itemsize == datatypes.ITEMSIZE[name] and np.little_endian}

def decode_raw(body: bytes, model: str, version: str, inputs: dict, max_batch_size: int) -> InferRequest:
    """Triton's raw binary request (Inference-Header-Content-Length: 0): the whole body is the one
    input of a single-input model, batch 1 for a batching model, its shape deduced from the body's
    size (at most one variable dimension; a BYTES input must have dims [1] and the body is its one
    element). `inputs` maps names to validation.TensorConfig."""
    prefix = "[request id: <id_unknown>] "
    if len(inputs) != 1:
        raise invalid(f"{prefix}Raw request must only have 1 input (found 1) to be deduced but got {len(inputs)} "
                      f"inputs in '{model}' model configuration")
    (config,) = inputs.values()
    batch = [1] if max_batch_size > 0 else []
    if config.datatype == "BYTES":
        if list(config.dims) != [1]:
            raise invalid(f"{prefix}For BYTE datatype raw input '{config.name}', the model must have input shape [1]")
        data = len(body).to_bytes(4, "little") + bytes(body)
        return InferRequest(model, version, "", [Tensor(config.name, "BYTES", batch + [1], data)], None, {})
    variable = [i for i, d in enumerate(config.dims) if d == -1]
    if len(variable) > 1:
        raise invalid(f"{prefix}The shape of the raw input '{config.name}' can not be deduced because there are more "
                      "than one variable-sized dimension")
    itemsize = datatypes.ITEMSIZE[config.datatype]
    dims = list(config.dims)
    if variable:
        fixed = 1
        for d in dims:
            fixed *= d if d != -1 else 1
        dims[variable[0]] = (len(body) // itemsize) // fixed if fixed else 0
    shape = batch + dims
    want = datatypes.element_count(shape) * itemsize
    if want != len(body):  # checked here, under the name Triton gives the raw body
        raise invalid(f"{prefix}input byte size mismatch for input 'raw_input' for model '{model}'. Expected {want}, "
                      f"got {len(body)}")
    return InferRequest(model, version, "", [Tensor(config.name, config.datatype, shape, body)], None, {})

UNPARSABLE = "failed to parse the request JSON buffer"  # how a body that is no JSON is refused


def compress(body: bytes, accept_encoding: str) -> tuple[bytes, str]:
    accepted = [p.split(";")[0].strip().lower() for p in accept_encoding.split(",")]
    if "gzip" in accepted:
        c = zlib.compressobj(wbits=16 + zlib.MAX_WBITS)
        return c.compress(body) + c.flush(), "gzip"
    if "deflate" in accepted:
        return zlib.compress(body), "deflate"
    return body, ""


# Triton's words, too many values or too few (its qa greps for them)
_DATA_COUNT_MISMATCH = "Unable to parse 'data': Shape does not match true shape of 'data' field"


def _json_data(name: str, datatype: str, shape: list[int], data) -> bytes:
    """JSON tensor data (flat or nested lists) as raw bytes in the wire layout."""
    count = math.prod(shape)
    code = _ARRAY_CODES.get(datatype)
    if code is not None and type(data) is list:
        try:
            packed = array.array(code, data)
        except (TypeError, ValueError, OverflowError):
            pass  # numpy's to take or refuse
        else:
            if len(packed) != count:
                raise invalid(_DATA_COUNT_MISMATCH)
            return packed.tobytes()
    try:
        if datatype == "BYTES":
            flat = np.asarray(data, dtype=np.object_).reshape(-1)
            if flat.size != count:
                raise invalid(_DATA_COUNT_MISMATCH)
            for item in flat:
                if not isinstance(item, str):
                    raise ValueError("expected a string for a BYTES element")
            return datatypes.serialize_bytes(flat)
        if datatype == "BF16":
            values = np.asarray(data, dtype=np.float32).astype(datatypes.NUMPY_OF["BF16"])
        else:
            values = np.asarray(data, dtype=datatypes.NUMPY_OF[datatype])
    except (ValueError, TypeError, OverflowError) as e:
        raise invalid(f"Unable to parse 'data': {e} (input '{name}')") from None
    if values.size != count:
        raise invalid(_DATA_COUNT_MISMATCH)
    return values.tobytes()  # C order, as the array was made from the lists


def json_object(buffer) -> dict:
    """A JSON object from a request body; INVALID_ARG with the parser's words otherwise."""
    try:
        doc = orjson.loads(buffer)
    except orjson.JSONDecodeError as e:
        raise invalid(f"{UNPARSABLE}: {e}") from None
    if not isinstance(doc, dict):
        raise invalid(f"{UNPARSABLE}: expected a JSON object")
    return doc


# The common request, read by a typed decoder in one pass of native code (`_typed_request`): what it
# cannot take as it is goes to the general decode below, which words whatever is wrong. Numbers are
# kept within the integers orjson reads as integers, so that what the typed decode takes, the
# general one would take alike.
_Dim = Annotated[int, msgspec.Meta(ge=-(1 << 63), le=(1 << 63) - 1)]


class _TypedInput(msgspec.Struct):
    name: str
    datatype: str
    shape: list[_Dim]
    data: Any = None
    parameters: Any = None


class _TypedOutput(msgspec.Struct):
    name: str
    parameters: Any = None


class _TypedRequest(msgspec.Struct):
    inputs: list[_TypedInput]
    outputs: list[_TypedOutput] | msgspec.UnsetType = msgspec.UNSET
    parameters: Any = None
    id: str = ""


_typed_decode = msgspec.json.Decoder(_TypedRequest).decode
_JSON_INT_MIN, _JSON_INT_END = -(1 << 63), 1 << 64  # the integers orjson reads as int (beyond: float)


def _plain_values(parameters: dict) -> bool:
    """Whether every value is one both decoders read alike: a string, a boolean, or an integer
    within 64 bits."""
    for value in parameters.values():
        kind = type(value)
        if kind is int:
            if not _JSON_INT_MIN <= value < _JSON_INT_END:
                return False
        elif kind is not str and kind is not bool:
            return False
    return True


def _typed_request(header, binary: memoryview, model: str, version: str) -> tuple[InferRequest, bool] | None:
    """decode_infer of the common request: JSON data of a fixed-size datatype in flat lists, or
    binary tensors; plain parameters. None for anything else, or anything wrong: the general
    decode takes it from the start."""
    try:
        typed = _typed_decode(header)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    end = len(binary)
    pos = 0
    inputs = []
    for item in typed.inputs:
        datatype = item.datatype
        params = item.parameters
        data = item.data
        if params:
            if datatype not in _ITEMSIZE:
                return None
            if type(params) is not dict or len(params) != 1 or data is not None:
                return None
            size = params.get("binary_data_size")
            if type(size) is not int or not 0 <= size <= end - pos:
                return None
            inputs.append(Tensor(item.name, datatype, item.shape, binary[pos:pos + size], params))
            pos += size
            continue
        code = _ARRAY_CODES.get(datatype)
        if code is None or type(data) is not list:
            return None
        try:
            packed = array.array(code, data)
        except (TypeError, ValueError, OverflowError):
            return None
        if len(packed) != math.prod(item.shape):
            return None
        inputs.append(Tensor(item.name, datatype, item.shape, packed.tobytes(), {}))
    if pos != end:
        return None
    outputs = None
    if typed.outputs is not msgspec.UNSET:
        outputs = []
        for wanted in typed.outputs:
            params = wanted.parameters
            if not params:
                params = {}
            elif type(params) is not dict or len(params) != 1 or type(params.get("binary_data")) is not bool:
                return None
            outputs.append(RequestedOutput(wanted.name, params))
    parameters = typed.parameters
    binary_default = False
    if not parameters:
        parameters = {}
    elif type(parameters) is not dict or not _plain_values(parameters):
        return None
    else:
        try:
            check_json_request(parameters)
        except ServerError:
            return None
        binary_default = parameters.pop("binary_data_output", False)
    return InferRequest(model, version, typed.id, inputs, outputs, parameters), binary_default


def decode_infer(body: bytes | memoryview, header_length: int | None, model: str,
                 version: str) -> tuple[InferRequest, bool]:
    """The core request, and whether outputs default to binary (`binary_data_output`)."""
    if header_length is not None and not 0 <= header_length <= len(body):
        raise invalid(f"Inference-Header-Content-Length {header_length} is outside the body of "
                      f"{len(body)} bytes")
    header: bytes | memoryview
    if header_length is None:  # all JSON: no view made unless the general decode needs one
        header, binary = body, memoryview(b"")
    else:
        view = memoryview(body)
        header, binary = view[:header_length], view[header_length:]
    typed = _typed_request(header, binary, model, version)
    if typed is not None:
        return typed
    return _general_request(memoryview(header), binary, model, version)


if testing.CHECK_FAST_PATHS:
    def _checked_typed_request(header, binary: memoryview, model: str, version: str,
                               _fast=_typed_request) -> tuple[InferRequest, bool] | None:
        """The typed decode, and what the general decode makes of each request it takes
        (testing.CHECK_FAST_PATHS)."""
        typed = _fast(header, binary, model, version)
        if typed is None:
            return None
        try:
            general = _general_request(memoryview(header), binary, model, version)
        except ServerError as e:
            raise internal(f"the typed JSON decode took what the general decode refuses: {e.message}") from None
        difference = testing.request_difference(typed[0], general[0])
        if difference or typed[1] != general[1]:
            raise internal(f"the typed JSON decode and the general decode disagree: {difference or typed[1]}")
        return typed

    _typed_request = _checked_typed_request


def _general_request(header, binary: memoryview, model: str, version: str) -> tuple[InferRequest, bool]:
    """decode_infer of any request: the JSON `header`, then `binary`, the binary tensors' bytes."""
    doc = json_object(header)
    raw_inputs = doc.get("inputs")
    if type(raw_inputs) is not list:
        raise invalid("Unable to parse 'inputs': expected a list of input tensors")
    end = len(binary)
    pos = 0
    inputs = []
    for item in raw_inputs:  # orjson's objects: type() is the exact check
        name = item.get("name") if type(item) is dict else None
        if type(name) is not str:
            raise invalid("Unable to parse 'inputs': each input needs a 'name'")
        datatype = item.get("datatype")
        if datatype not in _ITEMSIZE:
            raise invalid(f"invalid datatype for input {name}")
        shape = item.get("shape")
        if type(shape) is not list or not _INT_ONLY.issuperset(map(type, shape)):
            raise invalid(f"Unable to parse 'shape' of input '{name}': expected a list of integers")
        params = item.get("parameters")
        if not params or type(params) is not dict:  # parameters that are not an object: none, as Triton reads them
            params = {}
            if "data" not in item:
                raise invalid(f"input '{name}' has neither 'data' nor a 'binary_data_size' parameter")
            data: bytes | memoryview | None = _json_data(name, datatype, shape, item["data"])
        elif "shared_memory_region" in params:
            check_json_shared_memory(params)
            data = None  # the server API resolves the region
        elif "binary_data_size" in params:
            size = params["binary_data_size"]
            if not unsigned(size):
                raise wrong_json_type("unsigned-integer", "Unable to parse 'binary_data_size': ")
            if pos + size > end:
                raise invalid(f"unexpected binary_data_size {size} for input '{name}': the request holds "
                              f"{end - pos} more bytes of binary data")
            data = binary[pos:pos + size]
            pos += size
        elif "data" in item:
            data = _json_data(name, datatype, shape, item["data"])
        else:
            raise invalid(f"input '{name}' has neither 'data' nor a 'binary_data_size' parameter")
        inputs.append(Tensor(name, datatype, shape, data, params))
    if pos != end:
        raise invalid(f"the request holds {end} bytes of binary data, but its inputs use {pos}")
    outputs = None
    if "outputs" in doc:
        raw_outputs = doc["outputs"]
        if type(raw_outputs) is not list:
            raise invalid("Unable to parse 'outputs': expected a list")
        outputs = []
        for item in raw_outputs:
            name = item.get("name") if type(item) is dict else None
            if type(name) is not str:
                raise invalid("Unable to parse 'outputs': each output needs a 'name'")
            params = item.get("parameters") or {}
            if type(params) is not dict:
                raise invalid(f"Unable to parse 'parameters' of output '{name}'")
            if params and (len(params) != 1 or type(params.get("binary_data")) is not bool):  # else nothing to check
                check_json_output(params)
            outputs.append(RequestedOutput(name, params))
    parameters = doc.get("parameters") or {}
    if type(parameters) is not dict:
        raise invalid("failed to get request params.: attempt to get members for non-object")
    if parameters:
        check_json_request(parameters)
    request_id = doc.get("id", "")
    if type(request_id) is not str:
        raise invalid("Unable to parse 'id': expected a string")
    binary_default = bool(parameters.pop("binary_data_output", False)) if parameters else False
    return InferRequest(model, version, request_id, inputs, outputs, parameters), binary_default


SMALL_JSON_OUTPUT = 512  # bytes: an output this small is made into Python numbers by `array`, in less time


def _json_values(t: Tensor):
    """An output's values for its JSON `data`. FP32 values are written as the doubles they are, as
    Triton writes them (0.1f is 0.10000000149011612)."""
    datatype = t.datatype
    if datatype == "BYTES":
        return [b.decode("utf-8", errors="replace") for b in datatypes.deserialize_bytes(t.data)]
    if datatype == "BF16":
        return np.frombuffer(t.data, dtype=datatypes.NUMPY_OF["BF16"]).astype(np.float32)
    code = _ARRAY_CODES.get(datatype)
    if code is not None and len(t.data) <= SMALL_JSON_OUTPUT:
        values = array.array(code)
        values.frombytes(t.data)
        return values.tolist()
    array_values = np.frombuffer(t.data, dtype=datatypes.NUMPY_OF[datatype])
    return array_values.astype(np.float64) if datatype == "FP32" else array_values


def encode_infer(response: InferResponse, request: InferRequest,
                 default_binary: bool = False) -> tuple[bytes | list, int | None]:
    """The response body and, when it carries binary tensors, the JSON header's length. With a
    binary output of LARGE_OUTPUT bytes or more, the body is a list of parts to be written in turn:
    the JSON header, then each output's own buffer (a view of the worker's arena), never joined."""
    wanted = {o.name: o.parameters for o in request.outputs} if request.outputs is not None else None
    outputs: list[dict[str, Any]] = []
    blobs = []
    for t in response.outputs:
        data = t.data
        if data is None:  # written into the client's shared-memory region
            outputs.append({"name": t.name, "datatype": t.datatype, "shape": t.shape})
        elif wanted.get(t.name, {}).get("binary_data", default_binary) if wanted is not None else default_binary:
            blob = memoryview(data).cast("B") if isinstance(data, memoryview) else data
            outputs.append({"name": t.name, "datatype": t.datatype, "shape": t.shape,
                            "parameters": {"binary_data_size": len(blob)}})
            blobs.append(blob)
        else:
            code = _ARRAY_CODES.get(t.datatype)
            if code is not None and len(data) <= SMALL_JSON_OUTPUT:  # _json_values' common case, written out
                packed = array.array(code)
                packed.frombytes(data)
                values = packed.tolist()
            else:
                values = _json_values(t)
            outputs.append({"name": t.name, "datatype": t.datatype, "shape": t.shape, "data": values})
    doc: dict[str, Any]
    if request.id:
        doc = {"id": request.id, "model_name": response.model_name, "model_version": response.model_version}
    else:
        doc = {"model_name": response.model_name, "model_version": response.model_version}
    if response.parameters:
        doc["parameters"] = response.parameters
    doc["outputs"] = outputs
    head = orjson.dumps(doc, option=orjson.OPT_SERIALIZE_NUMPY)
    if not blobs:
        return head, None
    if max(map(len, blobs)) >= LARGE_OUTPUT:  # each a bytes object or a memoryview of bytes
        return [head, *blobs], len(head)
    return b"".join([head, *blobs]), len(head)
