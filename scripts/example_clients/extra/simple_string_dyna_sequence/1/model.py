"""Triton's qa "simple_string_dyna_sequence" as its example clients expect it: a running sum of INPUT
per sequence (string correlation IDs), plus the correlation ID read as a number on the request that
ends the sequence."""
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.acc = {}

    def execute(self, requests):
        out = []
        for r in requests:
            x = int(pb_utils.get_input_tensor_by_name(r, "INPUT").as_numpy().flat[0])
            start = int(pb_utils.get_input_tensor_by_name(r, "START").as_numpy().flat[0])
            end = int(pb_utils.get_input_tensor_by_name(r, "END").as_numpy().flat[0])
            corrid = pb_utils.get_input_tensor_by_name(r, "CORRID").as_numpy().flat[0]
            corrid = corrid.decode() if isinstance(corrid, bytes) else str(corrid)
            y = (0 if start else self.acc.get(corrid, 0)) + x
            self.acc[corrid] = y
            if end:
                y += int(corrid)
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT", np.array([[y]], np.int32))]))
        return out
