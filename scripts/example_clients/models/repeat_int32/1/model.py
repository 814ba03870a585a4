"""Triton's "repeat" example backend as simple_grpc_custom_repeat.py expects it: one response per
element of IN (OUT, and its index IDX), each after its DELAY in microseconds, from a thread of its
own; then the final flag."""
import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for r in requests:
            data = pb_utils.get_input_tensor_by_name(r, "IN").as_numpy()
            delay = pb_utils.get_input_tensor_by_name(r, "DELAY").as_numpy()
            sender = r.get_response_sender()
            threading.Thread(target=self.answer, args=(data, delay, sender)).start()
        return None

    def answer(self, data, delay, sender):
        for i, (v, d) in enumerate(zip(data.flat, delay.flat)):
            time.sleep(d / 1e6)
            sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([v], np.int32)),
                                                    pb_utils.Tensor("IDX", np.array([i], np.uint32))]))
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
