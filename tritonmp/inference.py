"""The protocol-independent request and response types that both frontends decode into.

They are msgspec Structs, made several times for every request: a Struct is made by native code,
in a third of a slotted dataclass's time."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any

import msgspec

if TYPE_CHECKING:
    from .errors import ServerError


class Tensor(msgspec.Struct):
    """A tensor as raw bytes in Triton's wire layout (BYTES: length-prefixed elements)."""

    name: str
    datatype: str
    shape: list[int]
    data: Any = b""  # bytes, bytearray, memoryview; a ShmRef in a client region; None once written there
    parameters: dict = msgspec.field(default_factory=dict)


class RequestedOutput(msgspec.Struct):
    name: str
    parameters: dict = msgspec.field(default_factory=dict)
    shm: Any = None  # a ShmRef when the client wants the output written into its region


class InferRequest(msgspec.Struct):
    model_name: str
    model_version: str  # "" for the highest ready version
    id: str = ""
    inputs: list[Tensor] = msgspec.field(default_factory=list)
    outputs: list[RequestedOutput] | None = None  # None: all outputs
    parameters: dict = msgspec.field(default_factory=dict)
    # filled by validation and the scheduler
    batch_size: int = 0
    shape_key: tuple = ()
    arrival_ns: int = 0
    queue_ns: int = 0  # how long it waited in the queue, once it is sent to an instance
    # set when the request is queued (the scheduler's submit), and read only after that
    future: asyncio.Future = None  # type: ignore[assignment]
    trace: Any = None  # a tracing.Trace when this request is sampled
    priority: int = 0  # the scheduler's priority level
    deadline_ns: int = 0  # when its queue timeout runs out (0: never)
    delayed: bool = False  # its timeout ran out under timeout_action DELAY
    stream: asyncio.Queue | None = None  # decoupled models: responses, errors, then None
    empty_final: bool = False  # a gRPC stream's ask for the final flag alone as a response (never the model's)
    cancellable: bool = True  # its future may be cancelled (an awaiting task whose client went); a python
    # model's instance then tells the worker, and is_cancelled() says so. FastInfer's never is.
    null: bool = False  # a Direct sequence batch's placeholder row: it runs, but is answered and counted nowhere
    sequence: list | None = None  # a model with implicit state: [its sequence's key (None: placeholder), start, end]
    responded: bool = False  # a decoupled model has sent it a response (its first counts in the histogram)
    trace_context: dict | None = None  # the W3C trace context its client sent (traceparent, tracestate)
    trace_parent: Any = None  # an ensemble's step: the ensemble request's trace (tracing.Trace), if traced
    namespace: str = ""  # --model-namespacing: where its model is looked for first (the calling model's, for
    # an ensemble's step or a BLS call)


class InferResponse(msgspec.Struct):
    model_name: str
    model_version: str
    id: str
    outputs: list[Tensor]
    parameters: dict = msgspec.field(default_factory=dict)
    final: bool = True  # the last response to its request (a decoupled model's may not be)
    empty: bool = False  # only the final flag: a decoupled model closed its request with no more data


# What the server API lends the models for their own requests: infer (BLS), infer_stream (decoupled
# BLS), and model_call (a python model's is_model_ready, load and unload).
Infer = Callable[[InferRequest], Awaitable[InferResponse]]
InferStream = Callable[[InferRequest], AsyncIterator["InferResponse | ServerError"]]
ModelCall = Callable[[str, str, str, dict], Awaitable[bool]]
