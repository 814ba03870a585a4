"""The protocol-independent request and response types that both frontends decode into."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field


@dataclass(slots=True)
class Tensor:
    """A tensor as raw bytes in Triton's wire layout (BYTES: length-prefixed elements)."""

    name: str
    datatype: str
    shape: list[int]
    data: object = b""  # bytes, bytearray, memoryview; a ShmRef in a client region; None once written there
    parameters: dict = field(default_factory=dict)


@dataclass(slots=True)
class RequestedOutput:
    name: str
    parameters: dict = field(default_factory=dict)
    shm: object = None  # a ShmRef when the client wants the output written into its region


@dataclass(slots=True)
class InferRequest:
    model_name: str
    model_version: str  # "" for the highest ready version
    id: str = ""
    inputs: list[Tensor] = field(default_factory=list)
    outputs: list[RequestedOutput] | None = None  # None: all outputs
    parameters: dict = field(default_factory=dict)
    # filled by validation and the scheduler
    batch_size: int = 0
    shape_key: tuple = ()
    arrival_ns: int = 0
    queue_ns: int = 0  # how long it waited in the queue, once it is sent to an instance
    future: asyncio.Future | None = None
    trace: object = None  # a tracing.Trace when this request is sampled
    priority: int = 0  # the scheduler's priority level
    deadline_ns: int = 0  # when its queue timeout runs out (0: never)
    delayed: bool = False  # its timeout ran out under timeout_action DELAY
    stream: asyncio.Queue | None = None  # decoupled models: responses, errors, then None
    empty_final: bool = False  # a gRPC stream's ask for the final flag alone as a response (never the model's)


@dataclass(slots=True)
class InferResponse:
    model_name: str
    model_version: str
    id: str
    outputs: list[Tensor]
    parameters: dict = field(default_factory=dict)
    final: bool = True  # the last response to its request (a decoupled model's may not be)
    empty: bool = False  # only the final flag: a decoupled model closed its request with no more data
