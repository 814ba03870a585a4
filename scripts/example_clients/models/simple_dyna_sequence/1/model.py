"""Triton's qa "simple_dyna_sequence" as its example clients expect it: OUTPUT = INPUT, plus 1 on the
request that starts a sequence, plus the correlation ID on the one that ends it."""
import numpy as np
import triton_python_backend_utils as pb_utils


def _value(request, name: str) -> int:
    return int(pb_utils.get_input_tensor_by_name(request, name).as_numpy().flat[0])


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            y = _value(r, "INPUT") + _value(r, "START") + (_value(r, "CORRID") if _value(r, "END") else 0)
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT", np.array([[y]], np.int32))]))
        return out
