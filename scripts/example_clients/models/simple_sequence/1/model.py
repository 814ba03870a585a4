"""Triton's qa "simple_sequence" as its example clients expect it: OUTPUT = INPUT, plus 1 on the
request that starts a sequence."""
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            x = int(pb_utils.get_input_tensor_by_name(r, "INPUT").as_numpy().flat[0])
            start = int(pb_utils.get_input_tensor_by_name(r, "START").as_numpy().flat[0])
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT", np.array([[x + start]], np.int32))]))
        return out
