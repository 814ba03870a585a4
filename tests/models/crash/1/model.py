"""Echoes X as Y; a negative X kills the worker process the way a segfaulting library would."""
import os
import signal

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            if x[0] < 0:
                os.kill(os.getpid(), signal.SIGKILL)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", x)]))
        return responses
