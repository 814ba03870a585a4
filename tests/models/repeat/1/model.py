"""A decoupled model: answers a request N with N responses I = 0 .. N-1, from a thread of its own
after execute() has returned; N = -1 sends an error response between two good ones; N = -2 sends one
response and then dies, as a crashing library would."""
import os
import signal
import threading

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            n = int(pb_utils.get_input_tensor_by_name(request, "N").as_numpy()[0])
            sender = request.get_response_sender()
            threading.Thread(target=self.answer, args=(n, sender)).start()
        return None

    def answer(self, n, sender):
        if n == -2:
            sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("I", np.array([0], np.int32))]))
            os.kill(os.getpid(), signal.SIGKILL)
        if n < 0:
            sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("I", np.array([0], np.int32))]))
            sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError("negative counts are refused")))
            sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("I", np.array([1], np.int32))]))
        else:
            for i in range(n):
                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("I", np.array([i], np.int32))]))
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
