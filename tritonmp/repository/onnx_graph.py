"""Read an ONNX model's inputs and outputs in the frontend, with the `onnx` protobuf reader only
(no runtime is loaded there); model_io completes and checks a config from them."""

from __future__ import annotations

from tritonclient.grpc import model_config_pb2 as mc

from .model_io import GraphTensor

# onnx.TensorProto.DataType value -> Triton config type
_ONNX_TO_CONFIG = {
    1: mc.TYPE_FP32, 2: mc.TYPE_UINT8, 3: mc.TYPE_INT8, 4: mc.TYPE_UINT16, 5: mc.TYPE_INT16,
    6: mc.TYPE_INT32, 7: mc.TYPE_INT64, 8: mc.TYPE_STRING, 9: mc.TYPE_BOOL, 10: mc.TYPE_FP16,
    11: mc.TYPE_FP64, 12: mc.TYPE_UINT32, 13: mc.TYPE_UINT64, 16: mc.TYPE_BF16,
}


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
