"""Build the ONNX files of the example model repository (they are generated, not committed).

    python scripts/make_example_repo.py configs/model_repository

Writes add/1/model.onnx: C = A + B for FP32 inputs of shape [batch, 3].
"""

from __future__ import annotations

import os
import sys

import onnx
from onnx import TensorProto, helper


def binary_op_model(op: str, dtype: int = TensorProto.FLOAT, width: int | str = 3,
                    names: tuple[str, str, str] = ("A", "B", "C")) -> onnx.ModelProto:
    """A one-node graph out = op(a, b) over tensors of shape [batch, width]."""
    a, b, c = names
    shape = ["batch", width]
    graph = helper.make_graph(
        [helper.make_node(op, [a, b], [c])], f"{op.lower()}_graph",
        [helper.make_tensor_value_info(a, dtype, shape), helper.make_tensor_value_info(b, dtype, shape)],
        [helper.make_tensor_value_info(c, dtype, shape)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="tritonmp")
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def write(model: onnx.ModelProto, path: str) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = path + ".tmp"
    onnx.save(model, tmp)
    os.replace(tmp, path)


def main(repo: str) -> None:
    write(binary_op_model("Add"), os.path.join(repo, "add", "1", "model.onnx"))
    print(f"wrote {os.path.join(repo, 'add', '1', 'model.onnx')}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "configs/model_repository")
