"""Implicit sequence state, kept in the worker that runs the sequence (`sequence_batching.state`):
each state's input is given to the model with every request of a sequence, and the model's output
of that state is kept for the sequence's next request. A sequence stays on one instance from its
start to its end, so its state never travels through the frontend; the frontend only says, per row
of a batch, which sequence it is and whether it starts or ends (RequestHeader.sequence), and which
sequences it gave up on (Execute.released).

On a sequence's first request the input is the initial state: `zero_data`, a `data_file` under the
model's `initial_state/` directory, or, with no initial state, zeros with every variable dimension
1 (Triton gives uninitialized data there); a BYTES state's zeros are empty elements. A row that is
no sequence (a Direct batch's placeholder) gets the initial state too, and what the model makes of
it is dropped."""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from .. import datatypes
from .backend import WorkRequest, WorkResponse, WorkTensor


@dataclass
class _State:
    input_name: str
    output_name: str
    datatype: str
    initial: np.ndarray  # one row, without the batch dimension


def _zeros(dims: list[int], datatype: str) -> np.ndarray:
    """A state of zeros; of a BYTES state, empty elements (what a zeroed BYTES buffer holds)."""
    if datatype == "BYTES":
        return np.full(dims, b"", dtype=object)
    return np.zeros(dims, datatypes.NUMPY_OF[datatype])


def _as_bytes(array: np.ndarray) -> np.ndarray:
    out = np.empty(array.shape, dtype=object)
    out.reshape(-1)[:] = [e.encode() if isinstance(e, str) else e for e in array.reshape(-1)]
    return out


def _initial(state: dict, model_dir: str) -> np.ndarray:
    datatype = datatypes.from_config(state.get("data_type", "TYPE_INVALID"))
    inits = state.get("initial_state") or []  # Triton reads the first
    init = inits[0] if inits else None
    if not init:
        return _zeros([1 if int(d) < 0 else int(d) for d in state.get("dims", [])], datatype)
    dims = [int(d) for d in init.get("dims", [])]
    datatype = datatypes.from_config(init.get("data_type", state.get("data_type")))
    if init.get("data_file"):
        with open(os.path.join(model_dir, "initial_state", init["data_file"]), "rb") as f:
            data = f.read()
        count = int(np.prod(dims))
        if datatype == "BYTES":  # the file holds the elements in the BYTES layout
            return datatypes.deserialize_bytes(data, count).reshape(dims)
        return np.frombuffer(data, datatypes.NUMPY_OF[datatype], count=count).reshape(dims).copy()
    return _zeros(dims, datatype)


class SequenceStates:
    """The states of the sequences one worker runs: sequence key -> output name -> its last value."""

    def __init__(self, config: dict, model_dir: str):
        self.batched = int(config.get("max_batch_size", 0)) > 0
        self.states = [_State(s["input_name"], s["output_name"],
                              datatypes.from_config(s.get("data_type", "TYPE_INVALID")), _initial(s, model_dir))
                       for s in config.get("sequence_batching", {}).get("state", [])]
        self.output_names = {s.output_name for s in self.states}
        self.outputs = [o["name"] for o in config.get("output", [])]  # what a client may be given
        self.kept: dict[object, dict[str, np.ndarray]] = {}

    def release(self, keys) -> None:
        for key in keys:
            self.kept.pop(key, None)

    def prepare(self, request: WorkRequest, rows: list) -> None:
        """Give the request its state inputs (rows: [key, start, end] per row, key None for a
        placeholder), and make sure the model is asked for its state outputs."""
        for state in self.states:
            values = []
            for key, start, _end in rows:
                kept = None if start or key is None else self.kept.get(key, {}).get(state.output_name)
                values.append(state.initial if kept is None else kept)
            if self.batched:
                array = values[0][np.newaxis] if len(values) == 1 else np.stack(values)
            else:
                array = values[0]
            request.inputs.append(WorkTensor(state.input_name, state.datatype, np.ascontiguousarray(array)))
        if request.outputs:  # the client named its outputs: the model is asked for the states' too
            request.outputs = [*request.outputs, *(n for n in self.output_names if n not in request.outputs)]

    def keep(self, response: WorkResponse, rows: list, wanted: list[str]) -> None:
        """Keep each sequence's state outputs from the model's response (copied: the arena they lie
        in is reused), forget those of sequences that end, and take out of the response the state
        outputs the client is not to be given."""
        for tensor in response.outputs:
            if tensor.name not in self.output_names:
                continue
            array = np.asarray(tensor.array)
            if tensor.datatype == "BYTES":  # a backend may give str elements; an input's are bytes
                array = _as_bytes(array)
            for row, (key, _start, end) in enumerate(rows):
                if key is not None and not end:
                    value = array[row] if self.batched else array
                    self.kept.setdefault(key, {})[tensor.name] = np.array(value, copy=True)
        for key, _start, end in rows:
            if end and key is not None:
                self.kept.pop(key, None)
        visible = wanted or self.outputs
        response.outputs = [t for t in response.outputs if t.name not in self.output_names or t.name in visible]
