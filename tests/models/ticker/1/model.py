"""A decoupled model that streams I = 0, 1, ... from a thread of its own.

N >= 0: sends N responses, then the final flag. N < 0: sends -N responses, then waits until its
request is cancelled (by the client, or by a BLS caller), says so in the log ("ticker: cancelled
after K responses") and ends the request with a CANCELLED error.
"""

import os
import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils

CANCEL_WAIT_S = 60.0  # a request nobody cancels ends with an error after this


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            n = int(pb_utils.get_input_tensor_by_name(request, "N").as_numpy()[0])
            threading.Thread(target=self.tick, args=(n, request)).start()
        return None

    def tick(self, n, request):
        sender = request.get_response_sender()
        for i in range(abs(n)):
            sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("I", np.array([i], np.int32))]))
        if n >= 0:
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            return
        deadline = time.monotonic() + CANCEL_WAIT_S
        while not request.is_cancelled():
            if time.monotonic() > deadline:
                sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError("never cancelled")),
                            flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                return
            os.sched_yield()  # polls the cancellation flag, letting the worker's other threads run
        pb_utils.Logger.log_info(f"ticker: cancelled after {abs(n)} responses")
        sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError("cancelled", pb_utils.TritonError.CANCELLED)),
                    flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
