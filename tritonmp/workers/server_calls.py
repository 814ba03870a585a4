"""A python model's calls to the server, made over its worker's socket: inference requests to other
models (BLS: `exec`, `async_exec`, the response iterator of a decoupled call and its `cancel`),
model control (`is_model_ready`, `load_model`, `unload_model`), custom metrics, and the lines of its
`Logger`. PythonBackend.prepare installs them into pb_utils before the model is imported; the
worker loop itself knows nothing of them."""

from __future__ import annotations

import json

import numpy as np

from tritonmp import datatypes
from tritonmp.ipc import transport

from . import pb_utils
from .backend import WorkerHost


class ServerCalls:
    """The calls of the model in the worker `host`."""

    def __init__(self, host: WorkerHost):
        self.host = host

    def install(self) -> None:
        """Route pb_utils' calls to the server through this worker."""
        pb_utils._bls_executor = self.bls
        pb_utils._control_executor = self.control
        pb_utils.Logger._sink = self.log_send
        metrics = pb_utils.pb_metrics
        metrics._call, metrics._send = self.metric_call, self.metric_send
        metrics.outbox = self.host.metric_outbox  # released metrics go before the worker's next message
        pb_utils.SharedMemory._arena = self.host.out_arena

    def metric_call(self, op: str, args: dict) -> float:
        """A custom metric's creation or value, answered by the frontend."""
        result, _ = self.host.ask(transport.BlsRequest("", "", "", [], control=op, control_args=args), [])
        if result.error:
            raise pb_utils.TritonModelException(result.error)
        return result.number

    def log_send(self, level: str, message: str) -> None:
        """A line of the model's pb_utils.Logger, for the server's log."""
        self.host.send(transport.LOG, transport.Log(level, message))

    def metric_send(self, op: str, family: str, labels: dict, value: float) -> None:
        self.host.send(transport.METRIC, transport.MetricUpdate(op, family, labels, value))

    def control(self, op: str, model: str, version: str = "", **args) -> bool:
        """A model's own is_model_ready, load_model or unload_model, answered by the frontend."""
        result, _ = self.host.ask(transport.BlsRequest("", model, version, [], control=op, control_args=args), [])
        if result.error:
            raise pb_utils.TritonModelException(result.error)
        return result.value

    def _bls_header(self, request, frames: list, decoupled: bool) -> transport.BlsRequest:
        refs = []
        for t in request.inputs():
            array = np.asarray(t._host())
            buf = datatypes.to_buffer(t._datatype, array)
            refs.append(transport.TensorRef(t.name(), t._datatype, list(array.shape), frame=len(frames),
                                            nbytes=len(buf) if isinstance(buf, bytes) else buf.nbytes))
            frames.append(buf)
        params = json.loads(request.parameters()) if request.parameters() else {}
        if request.correlation_id():  # a request of a sequence, as the client protocols carry it
            params["sequence_id"] = request.correlation_id()
            params["sequence_start"] = bool(request.flags() & pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START)
            params["sequence_end"] = bool(request.flags() & pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_END)
        if request.timeout():
            params["timeout"] = request.timeout()
        version = "" if request.model_version() in (-1, None) else str(request.model_version())
        return transport.BlsRequest(request.request_id(), request.model_name(), version, refs,
                                    request.requested_output_names(), params, decoupled=decoupled,
                                    trace=request.trace().get_context() or "")

    def _bls_response(self, result: transport.BlsResult, frames, request=None) -> object:
        """A BLS answer as the model sees it; in GPU memory where the request prefers it and a GPU is there."""
        if result.error:
            code = getattr(pb_utils.TritonError, result.error_status, pb_utils.TritonError.INTERNAL)
            return pb_utils.InferenceResponse(error=pb_utils.TritonError(result.error, code))
        tensors = []
        for ref in result.outputs:
            t = self.host.decode_tensor(ref, frames)
            tensors.append(pb_utils.Tensor(t.name, t.array, t.datatype))
        preferred = getattr(request, "_preferred_memory", None)
        if preferred is not None and preferred.preferred_memory_type == pb_utils.TRITONSERVER_MEMORY_GPU:
            tensors = [t._to_gpu(preferred.preferred_device_id) for t in tensors]
        return pb_utils.InferenceResponse(tensors)

    def bls(self, request, decoupled: bool = False) -> object:
        """A model's own inference request: sent to the frontend, from any thread of the model. One
        InferenceResponse, or for a decoupled call a ResponseIterator over every response."""
        frames: list = []
        header = self._bls_header(request, frames, decoupled)
        if not decoupled:
            return self._bls_response(*self.host.ask(header, frames), request)
        number, answers = self.host.inbox.open_call()
        header.call = number
        self.host.send(transport.BLS, header, frames)
        # as Triton's, the call returns once its first response has come: iterating the responses then
        # waits only for the later ones (an `async_exec` leaves the model's event loop free meanwhile)
        first = self.host.inbox.answer(answers)

        def responses():
            answer = first
            try:
                while True:
                    if answer is None:
                        raise SystemExit(0)  # the frontend has gone
                    result, reply_frames = answer
                    # the final flag alone arrives as an empty response, as Triton's iterator yields it
                    yield pb_utils.InferenceResponse() if result.empty else \
                        self._bls_response(result, reply_frames, request)
                    if result.final:
                        return
                    answer = self.host.inbox.answer(answers)
            finally:
                self.host.inbox.close_call(number)

        def cancel():
            self.host.send(transport.BLS_CANCEL, transport.BlsCancel(number))

        return pb_utils.ResponseIterator(responses(), cancel)
