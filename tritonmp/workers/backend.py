"""What the worker loop hands a backend, what a backend hands back, and the contract every backend
implements (Backend): the worker loop reads nothing else of it."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import numpy as np

from tritonmp.ipc.transport import BlsRequest, BlsResult, TensorRef, TensorSpec, WorkerSpec

if TYPE_CHECKING:
    from tritonmp.ipc.arena import Arena

    from .inbox import Inbox


@dataclass
class WorkTensor:
    name: str
    datatype: str
    array: np.ndarray
    in_place: bool = False  # already written into its output buffer
    arena_offset: int = -1  # already written into the batch's output arena, at this offset


@dataclass
class WorkRequest:
    id: str
    inputs: list[WorkTensor]
    outputs: list[str]  # requested output names; empty means all
    parameters: dict = field(default_factory=dict)
    batch_sizes: list[int] = field(default_factory=list)
    sender: object = None  # python models: send(WorkResponse | None, final: bool), any time until final
    cancelled: object = None  # python models: an inbox.CancelFlag, set when the request's client has gone
    # outputs the client wants in its system shared memory: name -> the writable window there, so a
    # backend that can write its output in place saves a copy
    output_buffers: dict = field(default_factory=dict)
    # outputs the client wants in its CUDA shared memory, for backends that compute on the GPU
    # (writes_device_outputs): name -> (device address, bytes there)
    device_outputs: dict = field(default_factory=dict)
    # room in the batch's output arena, for a backend that can write an output there itself:
    # arena_alloc(nbytes) -> (writable view, offset), or None when the arena is full
    arena_alloc: object = None
    trace: str = ""  # python models: the W3C context (JSON) of its span, when traced as OpenTelemetry spans


@dataclass
class WorkResponse:
    outputs: list[WorkTensor] = field(default_factory=list)
    error: str = ""
    error_status: str = "INTERNAL"
    parameters: dict = field(default_factory=dict)  # the response's own parameters, for the client
    deferred: bool = False  # the response went, or will go, through the request's response sender
    rescheduled: bool = False  # run the request again in a later batch (TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)


class WorkerHost(Protocol):
    """What a backend may use of the worker that runs it, for calls of its model's own to the server."""

    inbox: Inbox  # where answers and cancellations arrive
    out_arena: Arena  # the first output arena (a python model's pb_utils.SharedMemory)
    metric_outbox: deque  # messages that go before the worker's next one

    def send(self, kind: bytes, header, frames=()) -> None:
        """Send a message to the frontend (from any thread)."""
        ...

    def ask(self, header: BlsRequest, frames: list) -> tuple[BlsResult, list]:
        """Send a call to the frontend and wait for its one answer."""
        ...

    def decode_tensor(self, ref: TensorRef, frames) -> WorkTensor:
        """A tensor of a message from the frontend, as the backend reads it."""
        ...


class Backend(ABC):
    """A model loaded in a worker: built from (WorkerSpec, its config as a dict), raising BackendError
    with the reason when it cannot load."""

    # what the loop may hand it, besides plain inputs and the output arena's frames
    writes_device_outputs = False  # it copies outputs into the client's CUDA regions itself
    writes_arena_outputs = False  # it writes outputs of known shapes into the batch's output arena
    uses_senders = False  # its requests carry response senders and cancellation flags (python models)
    checks_readiness = False  # it has a readiness check of its own (is_ready), asked while it may be executing
    detail = ""  # a line for the server's log when it is ready: providers, threads, device

    @classmethod  # noqa: B027 - most backends make no calls of their own
    def prepare(cls, host: WorkerHost) -> None:
        """Before the model loads: set up what its own calls to the server go through (`host`)."""

    def __init__(self, spec: WorkerSpec, config: dict) -> None:  # noqa: B027 - the contract's signature
        """Load the model of this instance (`spec`) with its configuration."""

    def output_arena(self, arena: Arena) -> None:  # noqa: B027 - only python models write arenas themselves
        """The output arena of the batches from now on (the frontend alternates two)."""

    @abstractmethod
    def metadata(self) -> tuple[list[TensorSpec], list[TensorSpec]]:
        """The model's inputs and outputs as the model itself declares them."""

    @abstractmethod
    def execute(self, requests: list[WorkRequest]) -> list[WorkResponse]:
        """One answer per request, in order."""

    def is_ready(self) -> bool:
        """The model's own readiness check, where `checks_readiness`: called from a thread of its own,
        while a batch may be executing. Raises BackendError (or whatever the model raises) when it
        cannot say."""
        return True

    def finalize(self) -> None:  # noqa: B027 - most backends hold nothing the process's exit does not free
        """Release what the model holds; the worker exits after."""


class BackendError(Exception):
    """A failure of a whole batch, reported to every request in it."""


def param(config: dict, key: str, default: str = "") -> str:
    """A model config parameter's string value."""
    return str(config.get("parameters", {}).get(key, {}).get("string_value", default))


def model_path(spec, config: dict) -> str:
    """The model file (or directory) of this instance's version."""
    import os

    return os.path.join(spec.model_dir, str(spec.model_version), config["default_model_filename"])


def tensor_dict(name: str, datatype: str, shape: list[int] | None) -> dict:
    """One tensor as a framework reads it: what `describe` functions return."""
    return {"name": name, "datatype": datatype, "shape": shape}


def check_io(config: dict, inputs: list[dict], outputs: list[dict], **options) -> None:
    """Fail the load, listing every problem, where the config and the model's own tensors disagree
    (the same check `tritonmp check` runs before serving)."""
    from google.protobuf import json_format
    from tritonclient.grpc import model_config_pb2 as mc

    from tritonmp import backends
    from tritonmp.repository import model_io

    proto = json_format.ParseDict(config, mc.ModelConfig(), ignore_unknown_fields=True)
    graph = model_io.from_specs(inputs), model_io.from_specs(outputs)
    what = backends.model_kind(config.get("backend", ""), config.get("platform", ""))
    problems = model_io.check(proto, graph, "config.pbtxt", what, all_inputs=True, **options)
    if problems:
        raise BackendError("the configuration does not match the model: " + "; ".join(str(p) for p in problems))
