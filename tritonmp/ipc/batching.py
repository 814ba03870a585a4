"""Turn a batch of requests into one worker message, and the worker's result back into one
response per request.

For framework backends the requests are merged: each request's input bytes are written straight
into its slice of one batched buffer (an arena region, or one frame for small tensors), and the
outputs are split back along the batch dimension. For the python backend each request keeps its
own tensors, and the worker hands execute() the list.
"""

from __future__ import annotations

import struct
from collections.abc import Callable

from .. import datatypes
from ..errors import ServerError, Status
from ..inference import InferRequest, InferResponse, Tensor
from ..repository.ragged import Ragged
from ..repository.reshape import Reshapes
from . import buffers, transport
from .arena import Arena
from .shm_registry import ShmRef

_len = struct.Struct("<I").unpack_from



def _place(datas: list, nbytes: int, arena: Arena, frames: list, ref: transport.TensorRef) -> None:
    """Put the concatenation of `datas` into the arena when large and room is left, else a frame."""
    ref.nbytes = nbytes
    if nbytes >= transport.INLINE_LIMIT:
        offset = arena.alloc(nbytes)
        if offset is not None:
            ref.offset = offset
            for data in datas:
                arena.write(data, offset)
                offset += buffers.nbytes(data)
            return
    ref.frame = len(frames)
    frames.append(datas[0] if len(datas) == 1 else b"".join(datas))


def _shm_ref(name: str, datatype: str, shape: list[int], ref: ShmRef) -> transport.TensorRef:
    return transport.TensorRef(name, datatype, shape, offset=ref.offset, nbytes=ref.nbytes, shm_key=ref.key,
                               shm_id=ref.region_id, cuda_handle=ref.raw_handle, cuda_device=ref.device_id)


def _shm_outputs(request: InferRequest) -> list[transport.TensorRef]:
    if request.outputs is None:
        return []
    return [_shm_ref(o.name, "", [], o.shm) for o in request.outputs if o.shm is not None]


def encode(batch_id: int, batch: list[InferRequest], merge: bool, arena: Arena,
           out_arena: int = 0, in_arena: int = 0, cancels: bool = False,
           reshapes: Reshapes | None = None, released: list | None = None,
           ragged: Ragged | None = None) -> tuple[bytes, list]:
    """The Execute header and tensor frames for `batch`; large inputs are written into `arena` (the
    worker's input arena number `in_arena`), and the worker writes large outputs into its output
    arena number `out_arena`. `cancels`: a batch sent ahead whose requests may be cancelled before
    it starts (the worker then leaves those out). `reshapes`: the model's, applied to the inputs'
    shapes. `released`: sequences whose implicit state the worker may forget. `ragged`: the model's
    ragged inputs (each one 1-dimensional tensor of the requests' elements) and batch inputs."""
    arena.reset()
    frames: list = []
    headers = [_merged(batch, arena, frames, ragged)] if merge else _one_by_one(batch, arena, frames)
    if reshapes is not None:
        for header in headers:
            reshapes.refs_to_model(header.inputs)
    return transport.encode(transport.Execute(batch_id, headers, out_arena, in_arena, cancels, released or [])), frames


def _merged(batch: list[InferRequest], arena: Arena, frames: list, ragged: Ragged | None) -> transport.RequestHeader:
    """A batch's requests as one: each input's rows one after another (a ragged input's elements)."""
    first = batch[0]
    sizes = [r.batch_size for r in batch]
    total = sum(sizes)
    refs = []
    for i, t in enumerate(first.inputs):
        if isinstance(t.data, ShmRef):  # requests with client shm are never merged
            refs.append(_shm_ref(t.name, t.datatype, list(t.shape), t.data))
            continue
        datas = [r.inputs[i].data for r in batch]
        if ragged is not None and t.name in ragged.inputs:
            shape = [sum(datatypes.element_count(r.inputs[i].shape) for r in batch)]
        else:
            shape = [total, *t.shape[1:]] if len(batch) > 1 else list(t.shape)
        ref = transport.TensorRef(t.name, t.datatype, shape)
        _place(datas, sum(buffers.nbytes(d) for d in datas), arena, frames, ref)
        refs.append(ref)
    if ragged is not None and ragged.batch_inputs:
        shapes = {t.name: [r.inputs[i].shape for r in batch] for i, t in enumerate(first.inputs)}
        for name, datatype, shape, data in ragged.made(shapes):
            ref = transport.TensorRef(name, datatype, shape)
            _place([data], len(data), arena, frames, ref)
            refs.append(ref)
    if any(r.outputs is None for r in batch):
        outputs = []
    else:
        outputs = sorted({o.name for r in batch for o in r.outputs or ()})
    return transport.RequestHeader(first.id, refs, outputs, first.parameters, sizes, _shm_outputs(first),
                                   [r.sequence for r in batch] if first.sequence is not None else [])


def _one_by_one(batch: list[InferRequest], arena: Arena, frames: list) -> list[transport.RequestHeader]:
    """A batch's requests each as it is (python models take them so)."""
    headers = []
    for r in batch:
        refs = []
        for t in r.inputs:
            data = t.data
            kind = type(data)  # small bytes decoded from JSON, or a small view of a binary body: a frame
            nbytes = len(data) if kind is bytes else data.nbytes if kind is memoryview else -1
            if 0 <= nbytes < transport.INLINE_LIMIT:
                refs.append(transport.TensorRef(t.name, t.datatype, t.shape, len(frames), 0, nbytes))
                frames.append(data)
                continue
            if isinstance(data, ShmRef):
                refs.append(_shm_ref(t.name, t.datatype, list(t.shape), data))
                continue
            ref = transport.TensorRef(t.name, t.datatype, list(t.shape))
            _place([data], buffers.nbytes(data), arena, frames, ref)
            refs.append(ref)
        names: list = []  # the requested outputs (none: all) and those to write into client regions
        shm: list = []
        for o in r.outputs or ():
            names.append(o.name)
            if o.shm is not None:
                shm.append(_shm_ref(o.name, "", [], o.shm))
        headers.append(transport.RequestHeader(r.id, refs, names, r.parameters, shm_outputs=shm,
                                               sequence=[r.sequence] if r.sequence is not None else [],
                                               trace=r.trace.context() if r.trace is not None else ""))
    return headers


def _buffer(ref: transport.TensorRef, frames, read: Callable[[int, int], memoryview] | None):
    if ref.shm_key or ref.cuda_handle:
        return None  # the worker wrote it into the client's region
    if ref.frame >= 0:
        return frames[ref.frame]
    if read is None:
        raise ServerError(f"output '{ref.name}' came without its bytes", Status.INTERNAL)
    return read(ref.offset, ref.nbytes)  # a view of the output arena, or a copy (OutputArenas.reader)


def _split_bytes(buf: memoryview, counts: list[int]) -> list[memoryview]:
    """Split a BYTES buffer into consecutive runs of `counts` elements each."""
    parts, pos = [], 0
    for count in counts:
        start = pos
        for _ in range(count):
            (n,) = _len(buf, pos)
            pos += 4 + n
        parts.append(buf[start:pos])
    return parts


def _check_output(ref: transport.TensorRef, output_types: dict[str, str], model: str) -> None:
    want = output_types.get(ref.name)
    if want is not None and want != ref.datatype:
        raise ServerError(f"model '{model}' returned output '{ref.name}' as {ref.datatype}, but its "
                          f"configuration declares {datatypes.to_config(want)}", Status.INTERNAL)


def _error(status: str, message: str) -> ServerError:
    return ServerError(message, Status[status] if status in Status.__members__ else Status.INTERNAL, from_model=True)


def decode(result: transport.Result, batch: list[InferRequest], merge: bool, frames,
           read: Callable[[int, int], memoryview], output_types: dict[str, str], model: str,
           version: str, ragged: Ragged | None = None) -> list[InferResponse | ServerError]:
    """One response (or error) per request of the batch, in order; `read(offset, nbytes)` gives the
    bytes of an output in the batch's output arena."""
    if result.error:
        err = ServerError(result.error, Status.INTERNAL)
        return [err] * len(batch)
    if merge:
        return _decode_merged(result, batch, frames, read, output_types, model, version, ragged)
    if len(result.responses) != len(batch):
        err = ServerError(f"model '{model}' answered {len(result.responses)} of {len(batch)} requests",
                          Status.INTERNAL)
        return [err] * len(batch)
    return [decode_one(header, request, frames, read, output_types, model, version)
            for request, header in zip(batch, result.responses)]


def decode_one(header: transport.ResponseHeader | transport.StreamResponse, request: InferRequest, frames,
               read: Callable[[int, int], memoryview] | None, output_types: dict[str, str], model: str,
               version: str) -> InferResponse | ServerError:
    """One request's response (or error), from a batch's result or from a response sender's message. Its
    outputs go as the model made them, their datatype included where it differs from the config's,
    as Triton's python backend sends them."""
    if header.error:
        return _error(header.error_status, header.error)
    try:
        tensors = []
        wanted = None if request.outputs is None else {o.name for o in request.outputs}
        for ref in header.outputs:
            want = output_types.get(ref.name)
            if want is None or (wanted is not None and ref.name not in wanted):
                continue
            # a frame's bytes as they came (the common case), else _buffer's answer
            data = frames[ref.frame] if ref.frame >= 0 and not ref.shm_key and not ref.cuda_handle else \
                _buffer(ref, frames, read)
            tensors.append(Tensor(ref.name, ref.datatype, ref.shape, data))
        response = InferResponse(model, version, request.id, tensors)
        if header.parameters:
            response.parameters = dict(header.parameters)
        return response
    except ServerError as e:
        return e


def _scattered(ref: transport.TensorRef, buf, batch: list[InferRequest], source: str, model: str) -> list[Tensor]:
    """batch_output BATCH_SCATTER_WITH_INPUT_SHAPE: each request's part of the output, in the shape of
    its source input."""
    shapes = [next(t.shape for t in r.inputs if t.name == source) for r in batch]
    itemsize = datatypes.ITEMSIZE.get(ref.datatype, 0)
    counts = [datatypes.element_count(s) for s in shapes]
    if ref.datatype == "BYTES" or len(buf) != sum(counts) * itemsize:
        raise ServerError(f"model '{model}' returned output '{ref.name}' of {len(buf)} bytes, which cannot be "
                          f"scattered in the shapes of input '{source}'", Status.INTERNAL)
    tensors, pos = [], 0
    for shape, count in zip(shapes, counts):
        tensors.append(Tensor(ref.name, ref.datatype, list(shape), buf[pos:pos + count * itemsize]))
        pos += count * itemsize
    return tensors


def _decode_merged(result, batch, frames, read, output_types, model, version, ragged=None):
    (header,) = result.responses
    if header.error:
        return [_error(header.error_status, header.error)] * len(batch)
    sizes = [r.batch_size for r in batch]
    total = sum(sizes)
    per_request: list[list[Tensor]] = [[] for _ in batch]
    try:
        for ref in header.outputs:
            _check_output(ref, output_types, model)
            buf = _buffer(ref, frames, read)
            if ragged is not None and ref.name in ragged.scatter and buf is not None:
                for i, scattered in enumerate(_scattered(ref, buf, batch, ragged.scatter[ref.name], model)):
                    per_request[i].append(scattered)
                continue
            if len(batch) == 1 or buf is None:
                per_request[0].append(Tensor(ref.name, ref.datatype, ref.shape, buf))
                continue
            if not ref.shape or ref.shape[0] != total:
                raise ServerError(f"model '{model}' returned output '{ref.name}' with shape {ref.shape}, "
                                  f"whose first dimension should be the batch size {total}", Status.INTERNAL)
            row_elems = datatypes.element_count(ref.shape[1:])
            if ref.datatype == "BYTES":
                parts = _split_bytes(buf, [s * row_elems for s in sizes])
            else:
                row_bytes = row_elems * datatypes.ITEMSIZE[ref.datatype]
                parts, pos = [], 0
                for s in sizes:
                    parts.append(buf[pos:pos + s * row_bytes])
                    pos += s * row_bytes
            for i, (s, part) in enumerate(zip(sizes, parts)):
                per_request[i].append(Tensor(ref.name, ref.datatype, [s, *ref.shape[1:]], part))
    except ServerError as e:
        return [e] * len(batch)
    out = []
    for request, tensors in zip(batch, per_request):
        if request.outputs is not None:
            wanted = {o.name for o in request.outputs}
            tensors = [t for t in tensors if t.name in wanted]
        out.append(InferResponse(model, version, request.id, tensors))
    return out
