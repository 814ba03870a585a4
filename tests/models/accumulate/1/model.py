"""A stateful model: keeps a running sum of X per sequence, reset by the START control input."""
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.sums = {}

    def execute(self, requests):
        responses = []
        for request in requests:
            x = int(pb_utils.get_input_tensor_by_name(request, "X").as_numpy().flat[0])
            start = int(pb_utils.get_input_tensor_by_name(request, "START").as_numpy().flat[0])
            corrid = int(pb_utils.get_input_tensor_by_name(request, "CORRID").as_numpy().flat[0])
            assert corrid == request.correlation_id()
            self.sums[corrid] = (0 if start else self.sums.get(corrid, 0)) + x
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("SUM", np.array([[self.sums[corrid]]], np.int32)),
                pb_utils.Tensor("SEEN_ID", np.array([[corrid]], np.uint64))]))
        return responses
