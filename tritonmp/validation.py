"""Check a request against its model's configuration before it is queued, with Triton's wording."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import msgspec

from . import datatypes, testing
from .errors import ServerError, internal, invalid
from .inference import InferRequest
from .ipc.shm_registry import ShmRef


@dataclass(frozen=True)
class TensorConfig:
    name: str
    datatype: str
    dims: tuple[int, ...]
    optional: bool = False
    ragged: bool = False  # allow_ragged_batch: its shape does not keep requests from batching together
    # the dims as a list (what a request's shape past its batch dimension is compared with), and the
    # bytes of one row of them when every dimension is fixed, else -1: a request whose shape is the
    # configured one then needs no dimension-by-dimension look
    dims_list: list = field(init=False, repr=False, compare=False)
    row_bytes: int = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        fixed = all(d >= 0 for d in self.dims)
        object.__setattr__(self, "dims_list", list(self.dims))
        object.__setattr__(self, "row_bytes",
                           math.prod(self.dims) * datatypes.ITEMSIZE.get(self.datatype, 0) if fixed else -1)


def _fmt(shape) -> str:
    return "[" + ",".join(str(d) for d in shape) + "]"


BATCH_NOTE = (" NOTE: Setting a non-zero max_batch_size in the model config requires a batch dimension to "
              "be prepended to each input shape. If you want to specify the full shape including the batch "
              "dim in your input dims config, try setting max_batch_size to zero. See the model "
              "configuration docs for more info on max_batch_size.")


MAX_DIM = 2**63 - 1
RAGGED = "ragged"  # a ragged input's place in a request's shape key: any shape batches with any other


def check_request(request: InferRequest, model: str, max_batch_size: int, inputs: dict[str, TensorConfig],
                  outputs: dict[str, str]) -> None:
    """Raise an INVALID_ARG ServerError for the first thing wrong; set batch_size and shape_key.

    A request with every configured input once, each of its configured type, shape and size (the
    common case) is accepted in one pass that makes nothing but its shape key; anything else is
    looked at in Triton's order by `_check_in_order`, the one place that states the rules, which
    finds what is wrong and words it."""
    if not _one_pass(request, max_batch_size, inputs):
        _check_in_order(request, model, max_batch_size, inputs, outputs)
    elif request.outputs is not None:
        _check_outputs(request, model, outputs)


def _one_pass(request: InferRequest, max_batch_size: int, inputs: dict[str, TensorConfig]) -> bool:
    """Whether the request is of the common shape, every input as configured: then its batch_size and
    shape_key are set and its inputs put in configuration order. False, having changed nothing,
    for anything else."""
    tensors = request.inputs
    if len(tensors) != len(inputs):
        return False
    batched = max_batch_size > 0
    batch = 1 if not batched else -1
    key = []  # each input's shape past the batch dimension, in the order given
    in_order = True
    for t, config_name in zip(tensors, inputs):
        name = t.name
        cfg = inputs.get(name)
        datatype = t.datatype
        if cfg is None or datatype != cfg.datatype or datatype == "BYTES":
            return False
        if name != config_name:
            in_order = False
        shape = t.shape
        if batched:
            if not shape:
                return False
            rows = shape[0]
            if rows != batch:
                if batch != -1 or not 1 <= rows <= max_batch_size:
                    return False
                batch = rows
            rest = shape[1:]
        else:
            rest = shape
        data = t.data
        nbytes = len(data) if type(data) is bytes else \
            data.nbytes if isinstance(data, (memoryview, ShmRef)) else len(data)
        if cfg.row_bytes >= 0 and rest == cfg.dims_list:  # the configured shape: its size known
            if nbytes != batch * cfg.row_bytes:
                return False
            key.append(RAGGED if cfg.ragged else cfg.dims)
            continue
        count = batch
        dims = cfg.dims
        if len(rest) != len(dims):
            return False
        for e, d in zip(dims, rest):
            if d < 0 or d > MAX_DIM or (e != -1 and e != d):
                return False
            count *= d
        if nbytes != count * datatypes.ITEMSIZE[datatype]:
            return False
        key.append(RAGGED if cfg.ragged else tuple(rest))
    if not in_order:  # inputs in configuration order, so that merged batches line up
        if len({t.name for t in tensors}) != len(tensors):  # a name twice (so another missing)
            return False
        order = {name: i for i, name in enumerate(inputs)}
        ranked = sorted(zip(tensors, key), key=lambda pair: order[pair[0].name])
        tensors[:] = [t for t, _ in ranked]
        key = [rest for _, rest in ranked]
    request.batch_size = batch
    request.shape_key = tuple(key)  # the shapes in configuration order: the names go without saying
    return True

if testing.CHECK_FAST_PATHS:
    def _checked_one_pass(request: InferRequest, max_batch_size: int, inputs: dict[str, TensorConfig],
                          _fast=_one_pass) -> bool:
        """The one pass, and what the rules say of each request it takes (testing.CHECK_FAST_PATHS)."""
        given = list(request.inputs)
        if not _fast(request, max_batch_size, inputs):
            return False
        probe = msgspec.structs.replace(request, inputs=given, outputs=None)
        try:
            _check_in_order(probe, "probe", max_batch_size, inputs, {})
        except ServerError as e:
            raise internal(f"the one-pass request check took what the rules refuse: {e.message}") from None
        ours = (request.batch_size, request.shape_key, [t.name for t in request.inputs])
        theirs = (probe.batch_size, probe.shape_key, [t.name for t in probe.inputs])
        if ours != theirs:
            raise internal(f"the one-pass request check and the rules disagree: {ours} against {theirs}")
        return True

    _one_pass = _checked_one_pass


def _check_outputs(request: InferRequest, model: str, outputs: dict[str, str]) -> None:
    seen = set()
    for o in request.outputs or ():
        if o.name not in outputs:
            raise invalid(f"unexpected inference output '{o.name}' for model '{model}'")
        if o.name in seen:  # as newer Triton releases refuse it (2.51 let it through)
            raise invalid(f"{_prefix(request)}output '{o.name}' is requested more than once for model '{model}'")
        seen.add(o.name)


def _prefix(request: InferRequest) -> str:
    return f"[request id: {request.id or '<id_unknown>'}] "


def _check_in_order(request: InferRequest, model: str, max_batch_size: int, inputs: dict[str, TensorConfig],
                    outputs: dict[str, str]) -> None:
    """check_request for any request, looking at each thing in the order Triton does."""
    prefix = _prefix(request)
    given = {t.name for t in request.inputs}
    required = [n for n, c in inputs.items() if not c.optional]
    missing = [n for n in required if n not in given]
    if len(given) != len(request.inputs):
        raise invalid(f"{prefix}input names must be unique for model '{model}'")
    if missing or len(given) > len(inputs):
        got = ",".join(f"'{n}'" for n in sorted(given))
        miss = "[" + ",".join(f"'{n}'" for n in missing) if missing else ""  # none missing: Triton writes "]"
        expected = f"{len(required)} inputs" if len(required) == len(inputs) else \
            f"number of inputs between {len(required)} and {len(inputs)}"  # Triton's words with optional inputs
        raise invalid(f"{prefix}expected {expected} but got {len(request.inputs)} inputs for model "
                      f"'{model}'. Got input(s) [{got}], but missing required input(s) {miss}]. Please "
                      "provide all required input(s).")
    for t in request.inputs:
        if t.name not in inputs:
            raise invalid(f"{prefix}unexpected inference input '{t.name}' for model '{model}'")
    # As Triton: the batch size first (every input's first dimension), then each input's type and shape.
    batch = None
    if max_batch_size > 0:
        # Triton visits inputs in reverse order of arrival here, so the same input gets the blame
        for t in reversed(request.inputs):
            if not t.shape:
                raise invalid(f"{prefix}input '{t.name}' has no shape, but model '{model}' needs a batch "
                              "dimension")
            if batch is None:
                batch = t.shape[0]
            elif t.shape[0] != batch:
                raise invalid(f"{prefix}input '{t.name}' batch size does not match other inputs for '{model}'")
        if batch is None or batch < 1 or batch > max_batch_size:
            raise invalid(f"{prefix}inference request batch-size must be <= {max_batch_size} for '{model}'")
    key = []
    for t in request.inputs:
        cfg = inputs[t.name]
        if t.datatype != cfg.datatype:
            raise invalid(f"{prefix}inference input '{t.name}' data-type is '{t.datatype}', but model "
                          f"'{model}' expects '{cfg.datatype}'")
        shape = t.shape
        if any(d < 0 for d in shape):
            raise invalid(f"{prefix}input '{t.name}' for model '{model}' has a negative dimension in its shape "
                          f"{_fmt(shape)}")
        if any(d > MAX_DIM for d in shape):  # shapes are int64 everywhere past this point
            raise invalid(f"{prefix}input '{t.name}' for model '{model}' has a dimension over {MAX_DIM} in its "
                          f"shape {_fmt(shape)}")
        expected_shape = ((-1,) if max_batch_size > 0 else ()) + cfg.dims
        ok = len(shape) == len(expected_shape) and all(e == -1 or e == d for e, d in zip(expected_shape, shape))
        if not ok:
            note = BATCH_NOTE if max_batch_size > 0 else ""
            raise invalid(f"{prefix}unexpected shape for input '{t.name}' for model '{model}'. Expected "
                          f"{_fmt(expected_shape)}, got {_fmt(shape)}.{note}")
        key.append((t.name, RAGGED if cfg.ragged else tuple(shape[1:]) if max_batch_size > 0 else tuple(shape)))
        _check_size(t, prefix, model)
    request.batch_size = batch if batch is not None else 1  # set (and at least 1) where max_batch_size > 0
    if request.outputs is not None:
        _check_outputs(request, model, outputs)
    # inputs in configuration order, so that merged batches line up
    order = {name: i for i, name in enumerate(inputs)}
    request.inputs.sort(key=lambda t: order[t.name])
    if len(request.inputs) == len(inputs):  # every input: its shapes in that order say it all, as in the one pass
        shapes = dict(key)
        request.shape_key = tuple(shapes[t.name] for t in request.inputs)
    else:  # some optional input left out: which ones are part of the key
        request.shape_key = tuple(sorted(key))


def _check_size(t, prefix: str, model: str) -> None:
    count = datatypes.element_count(t.shape)
    data = t.data
    in_shm = isinstance(data, ShmRef)
    nbytes = data.nbytes if isinstance(data, (memoryview, ShmRef)) else len(data)
    if t.datatype == "BYTES" and in_shm:
        return  # elements in a client region are counted by the worker that reads them
    if t.datatype == "BYTES":
        try:
            have = datatypes.count_bytes_elements(data)
        except ValueError as e:
            raise invalid(f"{prefix}input '{t.name}' for model '{model}': {e}") from None
        if have != count:
            raise invalid(f"{prefix}input '{t.name}' for model '{model}' holds {have} BYTES elements, but its "
                          f"shape {_fmt(t.shape)} needs {count}")
        return
    want = count * datatypes.ITEMSIZE[t.datatype]
    if nbytes != want:
        raise invalid(f"{prefix}input byte size mismatch for input '{t.name}' for model '{model}'. Expected "
                      f"{want}, got {nbytes}")
