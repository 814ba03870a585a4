"""A python-based backend of the test suite (served with --backend-directory tests/backends): each of
its models multiplies its input by the factor its version directory's model.json names, and reports
which numpy it runs with."""

import json
import os

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    @staticmethod
    def auto_complete_config(config):
        config.set_max_batch_size(8)
        config.add_input({"name": "X", "data_type": "TYPE_FP32", "dims": [-1]})
        config.add_output({"name": "Y", "data_type": "TYPE_FP32", "dims": [-1]})
        config.add_output({"name": "NUMPY", "data_type": "TYPE_STRING", "dims": [1]})
        return config

    def initialize(self, args):
        with open(os.path.join(args["model_repository"], args["model_version"], "model.json")) as f:
            self.factor = np.float32(json.load(f)["factor"])

    def execute(self, requests):
        out = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            version = np.full((x.shape[0], 1), np.__version__.encode(), dtype=np.object_)
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", x * self.factor),
                                                   pb_utils.Tensor("NUMPY", version)]))
        return out
