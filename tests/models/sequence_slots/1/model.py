"""A stateful model that says where each request ran: its row of the batch and the batch's size,
with a running sum of X per sequence (rows whose READY is false are placeholders, and are left
alone). A request with the parameter "hold" makes HOLD.held, then waits until the file HOLD exists
before the batch runs."""
import json
import os
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.sums = {}

    def execute(self, requests):
        for request in requests:
            hold = json.loads(request.parameters() or "{}").get("hold")
            if hold:
                open(hold + ".held", "w").close()
            deadline = time.monotonic() + 60
            while hold and not os.path.exists(hold) and time.monotonic() < deadline:
                time.sleep(0.01)
        responses = []
        for row, request in enumerate(requests):
            x, start, ready, corrid = (int(pb_utils.get_input_tensor_by_name(request, name).as_numpy().flat[0])
                                       for name in ("X", "START", "READY", "CORRID"))
            total = -1
            if ready:
                total = self.sums[corrid] = (0 if start else self.sums.get(corrid, 0)) + x
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("SUM", np.array([[total]], np.int32)),
                pb_utils.Tensor("ROW", np.array([[row]], np.int32)),
                pb_utils.Tensor("BATCH", np.array([[len(requests)]], np.int32))]))
        return responses
