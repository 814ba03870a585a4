"""Triton's qa add/sub models as its example clients expect them: OUTPUT0 = INPUT0 + INPUT1 and
OUTPUT1 = INPUT0 - INPUT1, for numbers or for numbers written as strings (TYPE_STRING)."""
import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.dtype = json.loads(args["model_config"])["input"][0]["data_type"]

    def execute(self, requests):
        out = []
        for r in requests:
            a = pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()
            b = pb_utils.get_input_tensor_by_name(r, "INPUT1").as_numpy()
            if self.dtype == "TYPE_STRING":
                ai = np.array([int(x) for x in a.flat], np.int32).reshape(a.shape)
                bi = np.array([int(x) for x in b.flat], np.int32).reshape(b.shape)
                s = np.array([str(x).encode() for x in (ai + bi).flat], dtype=object).reshape(a.shape)
                d = np.array([str(x).encode() for x in (ai - bi).flat], dtype=object).reshape(a.shape)
            else:
                s, d = a + b, a - b
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", s), pb_utils.Tensor("OUTPUT1", d)]))
        return out
