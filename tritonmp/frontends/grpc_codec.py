"""gRPC protobuf messages (tritonclient's generated modules) to core requests, and core
responses back: raw_input_contents / raw_output_contents and the typed contents fields."""

from __future__ import annotations

import numpy as np
from tritonclient.grpc import service_pb2 as pb

from .. import datatypes
from ..core import InferRequest, InferResponse, RequestedOutput, Tensor
from ..errors import invalid

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


def decode_infer(msg: pb.ModelInferRequest) -> InferRequest:
    raw = msg.raw_input_contents
    tensors = msg.inputs
    params_of = [parameters_dict(t.parameters) if t.parameters else {} for t in tensors]
    in_shm = ["shared_memory_region" in p for p in params_of]
    if raw:
        for t in tensors:
            if t.HasField("contents"):  # Triton's words, which its example clients check for
                raise invalid(f"contents field must not be specified when using raw_input_contents for '{t.name}' "
                              f"for model '{msg.model_name}'")
    if raw and len(raw) != in_shm.count(False):
        raise invalid(f"expected {in_shm.count(False)} raw_input_contents, one per input not in shared memory, "
                      f"got {len(raw)}")
    inputs = []
    next_raw = 0
    itemsize = datatypes.ITEMSIZE
    for t, shm, params in zip(tensors, in_shm, params_of):
        datatype = t.datatype
        if datatype not in itemsize:
            raise invalid(f"invalid datatype for input {t.name}")
        if shm:
            data = None  # the dataplane resolves the region
        elif raw:
            data = raw[next_raw]
            next_raw += 1
        else:
            data = _typed_contents(t, datatype)
        inputs.append(Tensor(t.name, datatype, list(t.shape), data, params))
    outputs = None
    if msg.outputs:
        outputs = []
        for o in msg.outputs:
            params = parameters_dict(o.parameters) if o.parameters else {}
            params.pop("binary_data", None)
            outputs.append(RequestedOutput(o.name, params))
    return InferRequest(msg.model_name, msg.model_version, msg.id, inputs, outputs,
                        parameters_dict(msg.parameters) if msg.parameters else {})


def encode_infer(response: InferResponse) -> pb.ModelInferResponse:
    msg = pb.ModelInferResponse(model_name=response.model_name, model_version=response.model_version,
                                id=response.id)
    for t in response.outputs:
        msg.outputs.add(name=t.name, datatype=t.datatype, shape=t.shape)
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
