"""Writes Triton's qa "simple" model as an ONNX graph: INT32 INPUT0 and INPUT1 of shape [batch, 16],
OUTPUT0 = INPUT0 + INPUT1 and OUTPUT1 = INPUT0 - INPUT1 (its config.pbtxt leaves the tensors to
auto-complete, which the model-control example clients rely on)."""

import sys

import onnx
from onnx import TensorProto, helper


def main(path: str) -> None:
    shape = ["batch", 16]
    graph = helper.make_graph(
        [helper.make_node("Add", ["INPUT0", "INPUT1"], ["OUTPUT0"]),
         helper.make_node("Sub", ["INPUT0", "INPUT1"], ["OUTPUT1"])], "simple",
        [helper.make_tensor_value_info(n, TensorProto.INT32, shape) for n in ("INPUT0", "INPUT1")],
        [helper.make_tensor_value_info(n, TensorProto.INT32, shape) for n in ("OUTPUT0", "OUTPUT1")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)


if __name__ == "__main__":
    main(sys.argv[1])
