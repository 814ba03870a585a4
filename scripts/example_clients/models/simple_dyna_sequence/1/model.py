"""Triton's qa "simple_dyna_sequence" as its example clients expect it: OUTPUT = INPUT, plus 1 on the
request that starts a sequence, plus the correlation ID on the one that ends it."""
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            def control(name):
                return int(pb_utils.get_input_tensor_by_name(r, name).as_numpy().flat[0])

            y = control("INPUT") + control("START") + (control("CORRID") if control("END") else 0)
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT", np.array([[y]], np.int32))]))
        return out
