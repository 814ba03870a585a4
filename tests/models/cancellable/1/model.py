"""A model whose execute() says it has started ("cancellable: executing"), then waits, inside
execute, until its request is cancelled: it says so in the log ("cancellable: cancelled while
executing") and answers with a CANCELLED error. A request that
is never cancelled gets an error after CANCEL_WAIT_S."""

import os
import time

import triton_python_backend_utils as pb_utils

CANCEL_WAIT_S = 60.0


class TritonPythonModel:
    def execute(self, requests):
        pb_utils.Logger.log_info("cancellable: executing")
        deadline = time.monotonic() + CANCEL_WAIT_S
        while not all(request.is_cancelled() for request in requests):
            if time.monotonic() > deadline:
                return [pb_utils.InferenceResponse(error=pb_utils.TritonError("never cancelled")) for _ in requests]
            os.sched_yield()  # polls the cancellation flags, letting the worker's other threads run
        pb_utils.Logger.log_info("cancellable: cancelled while executing")
        return [pb_utils.InferenceResponse(error=pb_utils.TritonError("cancelled", pb_utils.TritonError.CANCELLED))
                for _ in requests]
