"""Reports where its instance runs: CUDA_VISIBLE_DEVICES, and the initialize() args as JSON."""
import json
import os

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.args = {k: v for k, v in args.items() if k != "model_config"}
        self.args["model_config_name"] = json.loads(args["model_config"])["name"]

    def execute(self, requests):
        devices = np.array([os.environ.get("CUDA_VISIBLE_DEVICES", "<unset>")], dtype=object)
        args = np.array([json.dumps(self.args)], dtype=object)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("DEVICES", devices), pb_utils.Tensor("ARGS", args)])
                for _ in requests]
