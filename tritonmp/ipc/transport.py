"""The wire between the frontend and a worker: message framing, message types, typed headers.

Each worker has one Unix stream socket to the frontend (one end of a socketpair, inherited by
the worker at exec). A message is a type byte, a msgpack header and tensor frames, preceded by
their lengths; it is written with one gather-write and read straight into one buffer. Headers
are msgspec Structs, never pickle. A tensor travels either as a frame (`frame` >= 0) or as a
reference into one of the worker's shared-memory arenas (`frame` == -1, then `offset`/`nbytes`).
Imported by the frontend and by workers; depends on msgspec only.
"""

from __future__ import annotations

import socket
import struct

import msgspec

from . import buffers

PROTOCOL_VERSION = 10

# message types
READY = b"R"  # worker -> frontend: loaded, with backend metadata
LOAD_FAILED = b"F"  # worker -> frontend: could not load; header carries the reason
EXECUTE = b"X"  # frontend -> worker: run one batch
RESULT = b"D"  # worker -> frontend: the batch's responses
STOP = b"S"  # frontend -> worker: finalize and exit
BLS = b"B"  # worker -> frontend: a model's own inference request (BLS), sent while it executes
BLS_RESULT = b"b"  # frontend -> worker: that request's response
STREAM = b"T"  # worker -> frontend: one response of a decoupled model (any number per request)
BLS_CANCEL = b"C"  # worker -> frontend: the model cancelled its decoupled BLS request (header: BlsCancel)
CANCEL = b"c"  # frontend -> worker: a request's client has gone (header: Cancel)
METRIC = b"M"  # worker -> frontend: a custom metric's update or deletion, unanswered (header: MetricUpdate)
LOG = b"L"  # worker -> frontend: a line of pb_utils.Logger, for the server's log as it is set now (header: Log)
READINESS = b"Q"  # frontend -> worker: ask the model's own readiness check (header: ReadinessCheck)
READINESS_RESULT = b"q"  # worker -> frontend: its answer (header: ReadinessResult)
SPEC = b"P"  # frontend -> worker: what it is to be (header: WorkerSpec), the first message on its socket


class TensorRef(msgspec.Struct, array_like=True, omit_defaults=True):
    name: str
    datatype: str
    shape: list[int]
    frame: int = -1  # index among the tensor frames, or -1 for the arena (or a client region)
    offset: int = 0
    nbytes: int = 0
    shm_key: str = ""  # set: the bytes lie in this client shared-memory segment at `offset`
    shm_id: int = 0  # the region's registration, so a replaced region is mapped afresh
    cuda_handle: bytes = b""  # set: the bytes lie in a client CUDA region (cudaIpcMemHandle) at `offset`
    cuda_device: int = -1


class RequestHeader(msgspec.Struct, array_like=True, omit_defaults=True):
    id: str
    inputs: list[TensorRef]
    outputs: list[str]  # requested outputs; empty means all
    parameters: dict = {}
    batch_sizes: list[int] = []  # for a merged batch: each original request's batch size
    shm_outputs: list[TensorRef] = []  # outputs to write into client regions (nbytes: room there)
    # a model with implicit sequence state: per row, [its sequence's key (None: a placeholder), start, end]
    sequence: list = []
    trace: str = ""  # a request traced as OpenTelemetry spans: its model span's W3C context, as JSON


class Execute(msgspec.Struct, array_like=True):
    batch_id: int
    requests: list[RequestHeader]
    out_arena: int = 0  # which of the worker's output arenas (WorkerSpec.out_arenas) takes this batch's outputs
    in_arena: int = 0  # which of the worker's input arenas (WorkerSpec.in_arenas) holds this batch's large inputs
    cancels: bool = False  # sent ahead with requests that can be cancelled: those cancelled by its start never run
    released: list = []  # keys of sequences given up (idled out) whose implicit state goes


class ResponseHeader(msgspec.Struct, array_like=True, omit_defaults=True):
    outputs: list[TensorRef] = []
    error: str = ""
    error_status: str = "INTERNAL"
    parameters: dict = {}  # the response's own parameters
    deferred: bool = False  # the response comes (or came) as a STREAM message from the response sender
    rescheduled: bool = False  # the model asked to run the request again (iterative sequences)


class Result(msgspec.Struct, array_like=True):
    batch_id: int
    responses: list[ResponseHeader]
    input_ns: int = 0
    infer_ns: int = 0
    output_ns: int = 0
    error: str = ""  # the whole batch failed (execute raised)
    not_run: list[int] = []  # the places of requests cancelled before the batch started: the model never had them


class BlsRequest(msgspec.Struct, array_like=True, omit_defaults=True):
    id: str
    model_name: str
    model_version: str
    inputs: list[TensorRef]
    outputs: list[str] = []
    parameters: dict = {}
    call: int = 0  # the worker's number for this call; its answers carry it
    decoupled: bool = False  # answer with every response (BLS_RESULTs until one is final)
    # a model-control call instead of an inference: "is_model_ready", "load_model", "unload_model"
    control: str = ""
    control_args: dict = {}
    trace: str = ""  # the W3C context (JSON) of the calling request's span, where the model passed its trace


class BlsResult(msgspec.Struct, array_like=True, omit_defaults=True):
    outputs: list[TensorRef] = []
    error: str = ""
    error_status: str = "INTERNAL"
    value: bool = False  # a model-control call's answer
    number: float = 0.0  # a custom metric's value
    call: int = 0
    final: bool = True  # the last answer to the call (decoupled calls have any number)
    empty: bool = False  # no response, only the final flag


class BlsCancel(msgspec.Struct, array_like=True):
    call: int


class ReadinessCheck(msgspec.Struct, array_like=True):
    number: int  # the frontend's number for this check; its answer carries it


class ReadinessResult(msgspec.Struct, array_like=True, omit_defaults=True):
    number: int
    ready: bool = False
    error: str = ""  # the check could not say: it raised, or answered something other than a bool


class Log(msgspec.Struct, array_like=True):
    level: str  # INFO, WARNING, ERROR or VERBOSE
    message: str


class MetricUpdate(msgspec.Struct, array_like=True, omit_defaults=True):
    op: str  # increment, set, observe, delete (a Metric), delete_family (a MetricFamily)
    family: str
    labels: dict = {}
    value: float = 0.0


class Cancel(msgspec.Struct, array_like=True):
    batch_id: int
    index: int  # the request's place in its batch


class StreamResponse(msgspec.Struct, array_like=True, omit_defaults=True):
    batch_id: int
    index: int  # the request's place in its batch
    outputs: list[TensorRef] = []
    error: str = ""
    error_status: str = "INTERNAL"
    final: bool = False
    empty: bool = False  # no response, only the final flag
    parameters: dict = {}


class TensorSpec(msgspec.Struct, array_like=True):
    name: str
    datatype: str
    shape: list[int]


class Ready(msgspec.Struct):
    protocol: int
    pid: int
    inputs: list[TensorSpec] = []
    outputs: list[TensorSpec] = []
    detail: str = ""  # what the backend wants logged, e.g. its execution providers
    checks_readiness: bool = False  # the model has a readiness check of its own (READINESS answers it)


class LoadFailed(msgspec.Struct):
    pid: int
    error: str


class WorkerSpec(msgspec.Struct):
    """Everything a worker needs to start: the first message on its socket (SPEC), as a config may
    be larger than an environment variable can hold (128 KiB)."""

    fd: int  # the worker's end of its socket to the frontend (as the worker numbers it)
    parent_pid: int
    model_name: str
    model_version: int
    model_dir: str
    backend: str
    config_json: str
    instance_name: str
    kind: str  # "CPU" or "GPU"
    device_id: int
    in_arenas: list[str]  # the input arenas: two, as the frontend may send a batch while one is in flight
    out_arenas: list[str]  # the output arenas: a batch's outputs go to the one its Execute names
    arena_bytes: int
    log_verbose: int = 0
    heap_retain_bytes: int = 0  # freed memory the worker keeps for reuse (tritonmp/workers/heap.py)
    cpu_cores: list[int] = []  # its host policy's cores (empty: wherever the frontend runs)
    numa_node: int = -1  # its host policy's NUMA node (-1: any)
    code_file: str = ""  # a python-based backend's model.py ("": the version directory's model file)


_encoder = msgspec.msgpack.Encoder()
encode = _encoder.encode
_decoders = {
    cls: msgspec.msgpack.Decoder(cls)
    for cls in (Execute, Result, Ready, LoadFailed, BlsRequest, BlsResult, StreamResponse, BlsCancel, Cancel,
                MetricUpdate, Log, ReadinessCheck, ReadinessResult)
}


def decode(cls, data):
    return _decoders[cls].decode(data)


SOCKET_ENV = "TRITONMP_WORKER_SOCKET"  # an exec'd worker's: "<its socket's fd> <the frontend's pid>"
# Tensors smaller than this travel in the message, as frames after its header; larger ones through the arena.
INLINE_LIMIT = 64 * 1024


# -- framing ---------------------------------------------------------------------------------
# [u64 n: bytes that follow] [u8 kind] [u32 header bytes] [u32 frames] [u64 frame bytes]*frames
# [header] [frame 0] [frame 1] ...
LENGTH = struct.Struct("<Q")
_HEAD = struct.Struct("<BII")


def _size(buf) -> int:
    return buf.nbytes if isinstance(buf, memoryview) else len(buf)


def pack(kind: bytes, header: bytes, frames=()) -> list:
    """The buffers of one message, in order, for a gather-write."""
    sizes = [f.nbytes if type(f) is memoryview else len(f) for f in frames]  # _size(), written out
    lead = _HEAD.pack(kind[0], len(header), len(sizes)) + struct.pack(f"<{len(sizes)}Q", *sizes)
    total = len(lead) + len(header) + sum(sizes)
    return [LENGTH.pack(total) + lead, header, *frames]


def unpack(message: memoryview) -> tuple[bytes, memoryview, list[memoryview]]:
    """(kind, header, frames) of a message without its length prefix; views, not copies."""
    kind, header_len, count = _HEAD.unpack_from(message, 0)
    pos = _HEAD.size
    sizes = struct.unpack_from(f"<{count}Q", message, pos)
    pos += 8 * count
    header = message[pos:pos + header_len]
    pos += header_len
    frames = []
    for n in sizes:
        frames.append(message[pos:pos + n])
        pos += n
    return bytes((kind,)), header, frames


def send_message(sock: socket.socket, kind: bytes, header: bytes, frames=()) -> None:
    """Blocking gather-write of a whole message (the worker's side)."""
    parts = [memoryview(p).cast("B") for p in pack(kind, header, frames) if _size(p)]
    while parts:
        sent = sock.sendmsg(parts)
        while sent:
            if sent >= parts[0].nbytes:
                sent -= parts[0].nbytes
                parts.pop(0)
            else:
                parts[0] = parts[0][sent:]
                sent = 0


def _recv_exact(sock: socket.socket, view: memoryview) -> bool:
    while view.nbytes:
        n = sock.recv_into(view)
        if n == 0:
            return False
        view = view[n:]
    return True


def read_spec(sock: socket.socket) -> WorkerSpec | None:
    """A worker's spec, the first message on its socket, read to its last byte and no further (what
    follows is the worker loop's); None when the frontend has gone."""
    prefix = memoryview(bytearray(LENGTH.size))
    if not _recv_exact(sock, prefix):
        return None
    (total,) = LENGTH.unpack(prefix)
    body = memoryview(bytearray(total))
    if not _recv_exact(sock, body):
        return None
    kind, header, _ = unpack(body)
    if kind != SPEC:
        raise ValueError(f"a worker's first message must be its spec, not {kind!r}")
    return msgspec.msgpack.decode(header, type=WorkerSpec)


class MessageReader:
    """Blocking reads of whole messages (the worker's side): small messages cost one recv (several
    may arrive in one), large ones are read straight into a buffer of their size."""

    def __init__(self, sock: socket.socket, scratch: int = 256 * 1024):
        self.sock = sock
        self.scratch = bytearray(scratch)
        self.view = memoryview(self.scratch)
        self.start = 0  # unread bytes lie in scratch[start:end]
        self.end = 0

    def buffered(self) -> bool:
        """Whether bytes already received wait to be read (so a poll of the socket would not see them)."""
        return self.end > self.start

    def _fill(self) -> bool:
        if self.start == self.end:
            self.start = self.end = 0
        elif self.end == len(self.scratch):  # move what is left to the front
            rest = self.end - self.start
            self.scratch[:rest] = self.view[self.start:self.end]
            self.start, self.end = 0, rest
        n = self.sock.recv_into(self.view[self.end:])
        self.end += n
        return n > 0

    def read(self) -> memoryview | None:
        """The next message without its length prefix; None when the peer has gone."""
        while self.end - self.start < LENGTH.size:
            if not self._fill():
                return None
        (total,) = LENGTH.unpack_from(self.scratch, self.start)
        first = self.start + LENGTH.size
        if first + total <= self.end:
            self.start = first + total
            return memoryview(bytes(self.view[first:first + total]))
        while first + total <= len(self.scratch) and first + total > self.end:
            if not self._fill():
                return None
            first = self.start + LENGTH.size
        if first + total <= self.end:
            self.start = first + total
            return memoryview(bytes(self.view[first:first + total]))
        # larger than what the scratch buffer can hold: the rest goes straight into its own buffer
        body = buffers.fresh(total)
        have = self.end - first
        body[:have] = self.view[first:self.end]
        self.start = self.end = 0
        if not _recv_exact(self.sock, body[have:]):
            return None
        return body
