"""Decoupled BLS: calls a decoupled model with exec(decoupled=True) and returns what its response
iterator gave: every I, the number of empty responses, the errors. MODE "exec" calls `ticker` with N;
"async" makes two async_exec(decoupled=True) calls at once (N and N + 1) and returns both sets of I;
"cancel" cancels the call after two responses and reads the iterator to its end, then cancels again
(the call is over: nothing happens), with N = -2 ticker waits to be cancelled and ends with its own
CANCELLED error, with N >= 2 it ignores the cancellation and sends its N responses and the final flag;
"plain" calls the non-decoupled add_py with decoupled=True (one response, final)."""

import asyncio

import numpy as np
import triton_python_backend_utils as pb_utils


def _request(model, n):
    if model == "add_py":
        ones = np.ones((1, 3), np.float32)
        inputs = [pb_utils.Tensor("A", ones), pb_utils.Tensor("B", ones)]
        return pb_utils.InferenceRequest(model_name=model, inputs=inputs, requested_output_names=["C"])
    return pb_utils.InferenceRequest(model_name=model, inputs=[pb_utils.Tensor("N", np.array([n], np.int32))],
                                     requested_output_names=["I"])


def _read(responses, seen, cancel_after=None):
    for response in responses:
        if response.has_error():
            seen["errors"].append(response.error().message())
        elif not response.output_tensors():
            seen["empty"] += 1
        else:
            tensor = response.output_tensors()[0]
            seen["i"].extend(int(v) for v in tensor.as_numpy().flatten())
        if cancel_after is not None and len(seen["i"]) == cancel_after:
            responses.cancel()
    if cancel_after is not None:
        responses.cancel()  # after the last response: nothing to cancel, and no error


class TritonPythonModel:
    async def execute(self, requests):
        answers = []
        for request in requests:
            n = int(pb_utils.get_input_tensor_by_name(request, "N").as_numpy()[0])
            mode = pb_utils.get_input_tensor_by_name(request, "MODE").as_numpy()[0].decode()
            seen = {"i": [], "empty": 0, "errors": []}
            if mode == "exec":
                _read(_request("ticker", n).exec(decoupled=True), seen)
            elif mode == "async":
                both = await asyncio.gather(_request("ticker", n).async_exec(decoupled=True),
                                            _request("ticker", n + 1).async_exec(decoupled=True))
                for responses in both:
                    _read(responses, seen)
            elif mode == "cancel":
                _read(_request("ticker", n).exec(decoupled=True), seen, cancel_after=2)
            else:
                _read(_request("add_py", n).exec(decoupled=True), seen)
            answers.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("I", np.array(seen["i"], np.int32)),
                pb_utils.Tensor("EMPTY", np.array([seen["empty"]], np.int32)),
                pb_utils.Tensor("ERRORS", np.array([e.encode() for e in seen["errors"]], dtype=object)),
            ]))
        return answers
