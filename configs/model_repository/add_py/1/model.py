"""C = A + B, written against Triton's python backend API; runs unchanged on Triton and tritonmp."""
import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        output = pb_utils.get_output_config_by_name(config, "C")
        self.output_dtype = pb_utils.triton_string_to_numpy(output["data_type"])

    def execute(self, requests):
        responses = []
        for request in requests:
            a = pb_utils.get_input_tensor_by_name(request, "A").as_numpy()
            b = pb_utils.get_input_tensor_by_name(request, "B").as_numpy()
            c = (a + b).astype(self.output_dtype)
            responses.append(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("C", c)]))
        return responses

    def finalize(self):
        pass
