"""What a model's worker asks of the server while it runs, served for one instance: inference
requests to other models (BLS, answered once, or for a decoupled call with every response until
the final one, which the model may cancel), model control (is_model_ready, load_model,
unload_model) and custom metrics (new families and metrics, values, updates and deletions).

The server lends these through one ModelServices, shared by every model version; the answers go on
the instance's channel of the moment, and never to a later incarnation of its worker."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass, field

from ..errors import ServerError, Status
from ..inference import Infer, InferRequest, InferResponse, InferStream, ModelCall, RequestedOutput, Tensor
from ..ipc import transport
from ..ipc.channel import Channel
from ..logs import get_logger
from ..observability.custom_metrics import CustomMetrics

log = get_logger("pool")


@dataclass
class ModelServices:
    """What the server lends the models for their own calls: the server API's infer (BLS) and
    infer_stream (decoupled BLS) and model_call (model control), once it serves the models, and the
    registry of their custom metrics."""

    bls: Infer | None = None
    bls_stream: InferStream | None = None
    control: ModelCall | None = None
    custom_metrics: CustomMetrics = field(default_factory=CustomMetrics)


class ModelCalls:
    """The calls of one instance's worker. `owner` owns the metrics its model makes (they go when it
    stops); `channel` and `pid` say the instance's channel and worker process id of the moment."""

    def __init__(self, name: str, services: ModelServices, owner: object, channel: Callable[[], Channel | None],
                 pid: Callable[[], int], namespace: str = ""):
        self.name = name  # the instance's, for the log
        self.namespace = namespace  # its model's (--model-namespacing): its calls look for models there first
        self.services = services
        self.owner = owner
        self.channel = channel
        self.pid = pid
        self.calls: dict[int, InferRequest] = {}  # decoupled BLS calls in progress, by number: the request each made

    def on_message(self, kind: bytes, header: memoryview, frames: list[memoryview]) -> None:
        """A BLS, BLS_CANCEL or METRIC message of the worker."""
        if kind == transport.BLS:
            request = transport.decode(transport.BlsRequest, header)
            if request.control.startswith("metric_"):  # answered at once, in order with the updates
                self._metric_call(request)
                return
            # the frames are views of this message's own buffer, which nothing else reuses
            asyncio.get_running_loop().create_task(self._call(request, frames))
        elif kind == transport.BLS_CANCEL:
            # the model cancelled its decoupled call: the called model hears of it (is_cancelled()),
            # and its responses still come until its final one, as it decides
            called = self.calls.get(transport.decode(transport.BlsCancel, header).call)
            if called is not None and not called.future.done():
                called.future.cancel()
        elif kind == transport.METRIC:
            update = transport.decode(transport.MetricUpdate, header)
            metrics = self.services.custom_metrics
            if update.op.startswith("delete"):
                metrics.delete(update.family, update.labels if update.op == "delete" else None, self.pid())
            else:
                metrics.update(update.op, update.family, update.labels, update.value)

    def _metric_call(self, msg: transport.BlsRequest) -> None:
        """A model's new MetricFamily or Metric, or a Metric's value."""
        registry, args, pid = self.services.custom_metrics, msg.control_args, self.pid()
        try:
            reply = transport.BlsResult()
            if msg.control == "metric_family_new":
                registry.family_new(args["name"], args["description"], args["kind"], self.owner, pid)
            elif msg.control == "metric_new":
                registry.metric_new(args["family"], args["labels"], args.get("buckets"), self.owner, pid)
            elif msg.control == "metric_value":
                reply.number = registry.value(args["family"], args["labels"])
            else:
                raise ServerError(f"unknown metric call '{msg.control}'", Status.INVALID_ARG)
        except ServerError as e:
            reply = transport.BlsResult(error=e.message, error_status=e.status.name)
        reply.call = msg.call
        channel = self.channel()
        if channel is not None:
            channel.send(transport.BLS_RESULT, transport.encode(reply), [])

    async def _call(self, msg: transport.BlsRequest, frames: list[memoryview]) -> None:
        """Serve a model's own request (another model's inference, or model control), and answer on
        this worker's channel: once, or for a decoupled call with every response until the final one."""
        channel = self.channel()

        def answer(reply: transport.BlsResult, reply_frames: list) -> None:
            reply.call = msg.call
            if channel is not None and channel is self.channel():
                channel.send(transport.BLS_RESULT, transport.encode(reply), reply_frames)

        services = self.services
        try:
            if msg.control:
                if services.control is None:
                    raise ServerError("model control is not available here", Status.UNAVAILABLE)
                value = await services.control(msg.control, msg.model_name, msg.model_version, msg.control_args)
                answer(transport.BlsResult(value=value), [])
                return
            if services.bls is None:
                raise ServerError("BLS requests are not available here", Status.UNAVAILABLE)
            inputs = [Tensor(r.name, r.datatype, list(r.shape), frames[r.frame]) for r in msg.inputs]
            outputs = [RequestedOutput(name) for name in msg.outputs] or None
            request = InferRequest(msg.model_name, msg.model_version, msg.id, inputs, outputs, msg.parameters,
                                   namespace=self.namespace, trace_parent=_trace_parent(msg.trace))
            if msg.decoupled:
                self.calls[msg.call] = request
                try:
                    await self._stream(request, answer)
                finally:
                    del self.calls[msg.call]
                return
            answer(*_bls_result(await services.bls(request)))
        except ServerError as e:
            answer(transport.BlsResult(error=e.message, error_status=e.status.name), [])
        except asyncio.CancelledError:  # the model cancelled its call before the called model had it
            answer(transport.BlsResult(error="Request for the model was cancelled", error_status="CANCELLED"), [])
        except Exception as e:  # a bug of ours must still answer, or the model would wait forever
            log.exception("BLS request from '%s' failed", self.name)
            answer(transport.BlsResult(error=f"internal error: {type(e).__name__}: {e}"), [])

    async def _stream(self, request: InferRequest, answer) -> None:
        """Every response of a decoupled BLS call, as it comes; the last carries the final flag."""
        final = False
        assert self.services.bls_stream is not None, "the server API lends infer_stream with infer"
        async for item in self.services.bls_stream(request):
            if isinstance(item, ServerError):
                final = item.final
                answer(transport.BlsResult(error=item.message, error_status=item.status.name, final=final), [])
                continue
            reply, reply_frames = _bls_result(item)
            reply.final, reply.empty = item.final, item.empty
            final = item.final
            answer(reply, reply_frames)
        if not final:
            answer(transport.BlsResult(empty=True), [])


def _trace_parent(context: str) -> dict | None:
    """The W3C context a BLS call carries (its caller's span, where the model passed its request's
    trace), as a propagator's carrier; None for none, or one that is not a JSON object."""
    if not context:
        return None
    try:
        carrier = json.loads(context)
    except ValueError:
        return None
    return carrier if isinstance(carrier, dict) else None


def _bls_result(response: InferResponse) -> tuple[transport.BlsResult, list]:
    refs: list[transport.TensorRef] = []
    frames: list = []
    for t in response.outputs:
        refs.append(transport.TensorRef(t.name, t.datatype, t.shape, frame=len(frames)))
        frames.append(t.data)
    return transport.BlsResult(outputs=refs), frames
