"""A decoupled model that sends I = 0, 1, ... N-1 every 20 ms from a thread of its own, and stops
early when its request is cancelled, saying so in the log ("ticker: cancelled after K responses")."""

import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            n = int(pb_utils.get_input_tensor_by_name(request, "N").as_numpy()[0])
            threading.Thread(target=self.tick, args=(n, request)).start()
        return None

    def tick(self, n, request):
        sender = request.get_response_sender()
        for i in range(n):
            if request.is_cancelled():
                pb_utils.Logger.log_info(f"ticker: cancelled after {i} responses")
                sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(
                    "cancelled", pb_utils.TritonError.CANCELLED)), flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                return
            sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("I", np.array([i], np.int32))]))
            time.sleep(0.02)
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
