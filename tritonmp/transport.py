"""The wire between the frontend and a worker: message types and their typed headers.

A message is [type byte, msgpack header, tensor frame, ...]. Headers are msgspec Structs, never
pickle. A tensor travels either as a separate zero-copy frame (`frame` >= 0) or as a reference
into one of the worker's shared-memory arenas (`frame` == -1, then `offset`/`nbytes`).
Imported by the frontend and by workers; depends on msgspec only.
"""

from __future__ import annotations

import msgspec

PROTOCOL_VERSION = 1

# message types
READY = b"R"  # worker -> frontend: loaded, with backend metadata
LOAD_FAILED = b"F"  # worker -> frontend: could not load; header carries the reason
EXECUTE = b"X"  # frontend -> worker: run one batch
RESULT = b"D"  # worker -> frontend: the batch's responses
STOP = b"S"  # frontend -> worker: finalize and exit


class TensorRef(msgspec.Struct, array_like=True, omit_defaults=True):
    name: str
    datatype: str
    shape: list[int]
    frame: int = -1  # index among the tensor frames, or -1 for the arena
    offset: int = 0
    nbytes: int = 0


class RequestHeader(msgspec.Struct, array_like=True, omit_defaults=True):
    id: str
    inputs: list[TensorRef]
    outputs: list[str]  # requested outputs; empty means all
    parameters: dict = {}
    batch_sizes: list[int] = []  # for a merged batch: each original request's batch size


class Execute(msgspec.Struct, array_like=True):
    batch_id: int
    requests: list[RequestHeader]


class ResponseHeader(msgspec.Struct, array_like=True, omit_defaults=True):
    outputs: list[TensorRef] = []
    error: str = ""
    error_status: str = "INTERNAL"


class Result(msgspec.Struct, array_like=True):
    batch_id: int
    responses: list[ResponseHeader]
    input_ns: int = 0
    infer_ns: int = 0
    output_ns: int = 0
    error: str = ""  # the whole batch failed (execute raised)


class TensorSpec(msgspec.Struct, array_like=True):
    name: str
    datatype: str
    shape: list[int]


class Ready(msgspec.Struct):
    protocol: int
    pid: int
    inputs: list[TensorSpec] = []
    outputs: list[TensorSpec] = []


class LoadFailed(msgspec.Struct):
    pid: int
    error: str


class WorkerSpec(msgspec.Struct):
    """Everything a worker needs to start; handed over in the environment."""

    endpoint: str
    identity: bytes
    parent_pid: int
    model_name: str
    model_version: int
    model_dir: str
    backend: str
    config_json: str
    instance_name: str
    kind: str  # "CPU" or "GPU"
    device_id: int
    in_arena: str
    out_arena: str
    arena_bytes: int
    log_verbose: int = 0


_encoder = msgspec.msgpack.Encoder()
encode = _encoder.encode
_decoders = {
    cls: msgspec.msgpack.Decoder(cls)
    for cls in (Execute, Result, Ready, LoadFailed)
}


def decode(cls, data):
    return _decoders[cls].decode(data)


def encode_spec(spec: WorkerSpec) -> str:
    """A spec as JSON text, fit for an environment variable (msgpack may hold NUL bytes)."""
    return msgspec.json.encode(spec).decode()


def decode_spec(text: str | bytes) -> WorkerSpec:
    return msgspec.json.decode(text, type=WorkerSpec)


SPEC_ENV = "TRITONMP_WORKER_SPEC"
# Tensors smaller than this travel as ZeroMQ frames; larger ones through the arena.
INLINE_LIMIT = 64 * 1024
