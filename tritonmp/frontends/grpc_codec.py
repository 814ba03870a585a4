"""gRPC protobuf messages (tritonclient's generated modules) to core requests, and core
responses back: raw_input_contents / raw_output_contents and the typed contents fields."""

from __future__ import annotations

import numpy as np
from tritonclient.grpc import service_pb2 as pb

from .. import datatypes, testing
from ..errors import ServerError, internal, invalid
from ..inference import InferRequest, InferResponse, RequestedOutput, Tensor
from ..ipc import buffers
from .request_params import RESERVED_GRPC, check_grpc_output, check_grpc_request, check_grpc_shared_memory

# datatype -> the InferTensorContents field that carries it in typed form
CONTENTS_FIELD = {
    "BOOL": "bool_contents", "INT8": "int_contents", "INT16": "int_contents", "INT32": "int_contents",
    "INT64": "int64_contents", "UINT8": "uint_contents", "UINT16": "uint_contents",
    "UINT32": "uint_contents", "UINT64": "uint64_contents", "FP32": "fp32_contents",
    "FP64": "fp64_contents", "BYTES": "bytes_contents",
}


def parameter_value(p: pb.InferParameter):
    which = p.WhichOneof("parameter_choice")
    return getattr(p, which) if which else None


def parameters_dict(params) -> dict:
    """A protobuf map of messages with a `parameter_choice` oneof (InferParameter,
    ModelRepositoryParameter, LogSettingsRequest.SettingValue) as plain values."""
    return {k: parameter_value(v) for k, v in params.items()}


def _typed_contents(t, datatype: str) -> bytes:
    field = CONTENTS_FIELD.get(datatype)
    if field is None:
        raise invalid(f"input '{t.name}' of datatype {datatype} must be sent in raw_input_contents; "
                      "it has no typed contents field")
    values = getattr(t.contents, field)
    if datatype == "BYTES":
        return datatypes.serialize_bytes(np.array(list(values), dtype=np.object_))
    return np.asarray(values, dtype=datatypes.NUMPY_OF[datatype]).tobytes()


RAW_INPUT_CONTENTS = 7  # ModelInferRequest's field number of raw_input_contents
SPLIT_MIN = 64 * 1024  # a request message this large is parsed without copying its raw contents


class SplitRequest:
    """A ModelInferRequest whose raw input contents were left where they arrived: `msg` holds the
    rest of the message, `raw` a view of each raw_input_contents entry, in order."""

    __slots__ = ("msg", "raw")

    def __init__(self, msg: pb.ModelInferRequest, raw: list):
        self.msg = msg
        self.raw = raw


def _read_varint(view: memoryview, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        b = view[pos]  # IndexError past the end
        value |= (b & 0x7F) << shift
        pos += 1
        if not b & 0x80:
            return value, pos
        shift += 7
        if shift > 63:
            raise ValueError("varint too long")


def _split_raw(view: memoryview) -> tuple[bytes, list] | None:
    """The message's top-level records without raw_input_contents (joined), and views of those
    contents; None when the bytes are not a well-formed sequence of records."""
    rest, raw = [], []
    pos = start = 0
    end = view.nbytes
    try:
        while pos < end:
            tag, body = _read_varint(view, pos)
            kind = tag & 7
            if kind == 0:
                _, after = _read_varint(view, body)
            elif kind == 1:
                after = body + 8
            elif kind == 2:
                length, body = _read_varint(view, body)
                after = body + length
            elif kind == 5:
                after = body + 4
            else:
                return None
            if after > end:
                return None
            if tag == RAW_INPUT_CONTENTS << 3 | 2:
                rest.append(view[start:pos])
                raw.append(view[body:after])
                start = after
            pos = after
    except (IndexError, ValueError):
        return None
    rest.append(view[start:end])
    return b"".join(rest), raw


def parse_infer_request(data) -> pb.ModelInferRequest | SplitRequest:
    """A ModelInferRequest from its bytes. A large one is parsed without its raw input contents,
    which stay views of `data`: they are copied once, into the worker's memory, and never into
    Python bytes or protobuf's own storage. Malformed bytes raise as protobuf's parser does."""
    view = memoryview(data).cast("B")
    if view.nbytes < SPLIT_MIN:
        return pb.ModelInferRequest.FromString(view)
    split = _split_raw(view)
    if split is None:
        return pb.ModelInferRequest.FromString(view)  # raises, as it should, for what is malformed
    rest, raw = split
    return SplitRequest(pb.ModelInferRequest.FromString(rest), raw)


def request_message(request: pb.ModelInferRequest | SplitRequest) -> pb.ModelInferRequest:
    """The protobuf message of a request, whichever way it was parsed (without raw contents when split)."""
    return request.msg if isinstance(request, SplitRequest) else request


_CHECK_FAST_PATHS = testing.CHECK_FAST_PATHS


def decode_infer(request: pb.ModelInferRequest | SplitRequest) -> InferRequest:
    """The core request of a ModelInferRequest. The common case (inputs of known datatypes, in
    raw_input_contents or in shared memory) is taken in one pass over the inputs; anything else,
    and every refusal, goes through `_decode_in_order`, which checks in Triton's order."""
    if isinstance(request, SplitRequest):
        msg, raw = request.msg, request.raw
    else:
        msg, raw = request, request.raw_input_contents
    if not raw:
        return _decode_in_order(msg, raw)
    inputs = []
    next_raw = 0
    count = len(raw)
    itemsize = datatypes.ITEMSIZE
    for t in msg.inputs:
        datatype = t.datatype
        if datatype not in itemsize or t.HasField("contents"):
            return _decode_in_order(msg, raw)
        if t.parameters:
            if check_grpc_shared_memory(t):
                inputs.append(Tensor(t.name, datatype, t.shape[:], None, parameters_dict(t.parameters)))
                continue
            params = parameters_dict(t.parameters)
        else:
            params = {}
        if next_raw == count:
            return _decode_in_order(msg, raw)
        inputs.append(Tensor(t.name, datatype, t.shape[:], raw[next_raw], params))
        next_raw += 1
    request = _request(msg, inputs)
    if _CHECK_FAST_PATHS:
        _check_one_pass(request, msg, raw)
    return request


def _check_one_pass(request: InferRequest, msg: pb.ModelInferRequest, raw) -> None:
    """What the decode in Triton's order makes of a request the one pass took (testing.CHECK_FAST_PATHS)."""
    try:
        ordered = _decode_in_order(msg, raw)
    except ServerError as e:
        raise internal(f"the one-pass gRPC decode took what the decode in order refuses: {e.message}") from None
    difference = testing.request_difference(request, ordered)
    if difference:
        raise internal(f"the one-pass gRPC decode and the decode in order disagree: {difference}")


def _request(msg: pb.ModelInferRequest, inputs: list, checked: bool = False) -> InferRequest:
    """The core request of `msg` with its inputs decoded (`checked`: its parameters too)."""
    if msg.parameters and not checked:
        check_grpc_request(msg.parameters)
    outputs = None
    if msg.outputs:
        outputs = []
        for o in msg.outputs:
            if o.parameters:
                check_grpc_output(o)
                params = parameters_dict(o.parameters)
                params.pop("binary_data", None)
            else:
                params = {}
            outputs.append(RequestedOutput(o.name, params))
    request = InferRequest(msg.model_name, msg.model_version, msg.id, inputs, outputs,
                           parameters_dict(msg.parameters) if msg.parameters else {})
    if RESERVED_GRPC in request.parameters:  # Triton's, not the model's
        request.empty_final = request.parameters.pop(RESERVED_GRPC)
    return request


def _decode_in_order(msg: pb.ModelInferRequest, raw) -> InferRequest:
    """The request, checked in Triton's order: its parameters, its inputs' datatypes, then each
    input's shared memory or data (raw contents are taken in order; any left over are not used)."""
    if msg.parameters:
        check_grpc_request(msg.parameters)
    tensors = msg.inputs
    itemsize = datatypes.ITEMSIZE
    for t in tensors:
        if t.datatype not in itemsize:
            raise invalid(f"invalid datatype for input {t.name}")
    inputs = []
    next_raw = 0
    for t in tensors:
        datatype = t.datatype
        shm = check_grpc_shared_memory(t) if t.parameters else False
        if shm:
            if t.HasField("contents"):
                raise invalid(f"unexpected 'content' provided when using shared memory for input tensor '{t.name}' "
                              f"for model '{msg.model_name}'")
            data = None  # the server API resolves the region
        elif t.HasField("contents"):
            if raw:  # Triton's words, which its example clients check for
                raise invalid(f"contents field must not be specified when using raw_input_contents for '{t.name}' "
                              f"for model '{msg.model_name}'")
            data = _typed_contents(t, datatype)
        elif next_raw < len(raw):
            data = raw[next_raw]
            next_raw += 1
        else:
            raise invalid(f"unable to find data for input tensor '{t.name}' for model '{msg.model_name}' in request.")
        inputs.append(Tensor(t.name, datatype, t.shape[:], data, parameters_dict(t.parameters) if t.parameters else {}))
    return _request(msg, inputs, checked=True)


def encode_infer(response: InferResponse, with_contents: bool = True) -> pb.ModelInferResponse:
    """The response as a protobuf message; without `with_contents`, raw_output_contents stays empty."""
    msg = pb.ModelInferResponse(model_name=response.model_name, model_version=response.model_version,
                                id=response.id)
    for t in response.outputs:
        msg.outputs.add(name=t.name, datatype=t.datatype, shape=t.shape)
        if with_contents:
            msg.raw_output_contents.append(b"" if t.data is None else bytes(t.data))
    for key, value in response.parameters.items():
        param = msg.parameters[key]
        if isinstance(value, bool):
            param.bool_param = value
        elif isinstance(value, int):
            param.int64_param = value
        else:
            param.string_param = str(value)
    return msg


RAW_OUTPUT_CONTENTS_TAG = b"\x32"  # ModelInferResponse field 6, length-delimited
WIRE_PARTS_MIN = 64 * 1024  # an output this large is sent from its own buffer, never copied here


class WireResponse:
    """A ModelInferResponse as the bytes of its wire form, in parts: the protobuf of all but the
    raw output contents, then one field-6 record per output, in order, whose large payloads are the
    outputs' own buffers (views of the worker's arena). Protobuf appends repeated fields met later
    in a message, so the parts make the same message; the frontend writes them without joining."""

    __slots__ = ("parts", "nbytes")

    def __init__(self, parts: list, nbytes: int):
        self.parts = parts
        self.nbytes = nbytes

    def SerializeToString(self) -> bytes:  # noqa: N802 - protobuf's name, for code that takes a message
        return b"".join(self.parts)


def encode_infer_wire(response: InferResponse) -> pb.ModelInferResponse | WireResponse:
    """The ModelInfer answer: a plain message when every output is small; else a WireResponse,
    which no Python code copies the large outputs into."""
    if not any(t.data is not None and buffers.nbytes(t.data) >= WIRE_PARTS_MIN for t in response.outputs):
        return encode_infer(response)
    parts: list = [encode_infer(response, with_contents=False).SerializeToString()]
    small = bytearray()
    for t in response.outputs:
        data = b"" if t.data is None else t.data
        n = buffers.nbytes(data)
        small += RAW_OUTPUT_CONTENTS_TAG + _varint(n)
        if n >= WIRE_PARTS_MIN:
            parts.append(bytes(small))
            small.clear()
            parts.append(memoryview(data).cast("B"))
        else:
            small += data
    if small:
        parts.append(bytes(small))
    return WireResponse(parts, sum(buffers.nbytes(p) for p in parts))



def _varint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)
