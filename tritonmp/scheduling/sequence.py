"""The sequence batcher, for stateful models: every request carries a correlation ID; a sequence
is bound to one model instance from its START request to its END (or until it idles out), its
requests run in order, and the model receives Triton's control inputs (START, END, READY, CORRID).

Requests of different sequences that share an instance run one after the other rather than in
one batch: the state a model keeps per sequence stays where it was, and ordering is exact.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from dataclasses import dataclass, field

import numpy as np
from tritonclient.grpc import model_config_pb2 as mc

from .. import datatypes
from ..errors import invalid
from ..inference import InferRequest, Tensor
from ..ipc.pool import Instance, InstancePool
from ..logs import get_logger
from .scheduler import DrainWaiters, end_unserved

log = get_logger("sequence")
Kind = mc.ModelSequenceBatching.Control


@dataclass
class Sequence:
    id: object
    instance: Instance | None = None
    pending: deque = field(default_factory=deque)
    running: InferRequest | None = None
    last_active: float = 0.0
    ended: bool = False


def _control_value(control, on: bool, corrid) -> tuple[str, bytes]:
    """(datatype, raw bytes of one element) of a control tensor."""
    if control.kind == Kind.CONTROL_SEQUENCE_CORRID:
        dt = datatypes.from_config(mc.DataType.Name(control.data_type))
        if dt == "BYTES":
            return dt, datatypes.serialize_bytes(np.array([str(corrid).encode()], dtype=object))
        return dt, np.array([corrid], dtype=datatypes.NUMPY_OF[dt]).tobytes()
    if control.int32_false_true:
        return "INT32", np.array([control.int32_false_true[int(on)]], np.int32).tobytes()
    if control.fp32_false_true:
        return "FP32", np.array([control.fp32_false_true[int(on)]], np.float32).tobytes()
    return "BOOL", np.array([control.bool_false_true[int(on)] if control.bool_false_true else on], np.bool_).tobytes()


class SequenceScheduler:
    def __init__(self, pool: InstancePool, config: mc.ModelConfig):
        self.pool = pool
        self.model = config.name
        sb = config.sequence_batching
        self.controls = [(c.name, control) for c in sb.control_input for control in c.control]
        numeric = [mc.DataType.Name(control.data_type)[len("TYPE_"):] for _, control in self.controls
                   if control.kind == Kind.CONTROL_SEQUENCE_CORRID and control.data_type != mc.TYPE_STRING]
        self.numeric_corrid = numeric[0] if numeric else ""  # the CORRID input's numeric type, if it has one
        self.idle_secs = (sb.max_sequence_idle_microseconds or 1_000_000) / 1e6
        self.batched = config.max_batch_size > 0
        self.per_instance = max(1, config.max_batch_size)  # sequences an instance holds at once
        self.sequences: dict[object, Sequence] = {}
        self.backlog: deque[Sequence] = deque()  # started sequences waiting for an instance
        self._timer: asyncio.TimerHandle | None = None
        self._drain = DrainWaiters(self.busy)
        pool.attach(self.pump, self.fail_all)

    @property
    def queue(self) -> list[InferRequest]:
        """Requests waiting (for metrics and draining)."""
        return [r for s in self.sequences.values() for r in s.pending]

    def _ids(self, request: InferRequest):
        """The request's correlation ID and START and END flags, refused as Triton refuses them."""
        if self.batched and request.batch_size != 1:
            raise invalid(f"inference request to model '{self.model}' must specify batch-size 1 due to requirements "
                          "of sequence batcher")
        p = request.parameters or {}
        corrid = p.get("sequence_id", 0)
        if corrid in (0, "", None):
            raise invalid(f"inference request to model '{self.model}' must specify a non-zero or non-empty "
                          "correlation ID")
        if type(corrid) is str and self.numeric_corrid:
            raise invalid(f"sequence ID '{corrid}' is a string, but model '{self.model}' takes its correlation ID "
                          f"(its CONTROL_SEQUENCE_CORRID input) as {self.numeric_corrid}: send an integer "
                          "sequence_id, or declare that control TYPE_STRING")
        return corrid, bool(p.get("sequence_start", False)), bool(p.get("sequence_end", False))

    def submit(self, request: InferRequest) -> asyncio.Future:
        corrid, start, end = self._ids(request)
        seq = self.sequences.get(corrid)
        if start:
            if seq is not None and not seq.ended:
                log.warning("sequence %s of model '%s' started again before it ended", corrid, self.model)
                self._release(seq)
            seq = Sequence(corrid)
            self.sequences[corrid] = seq
            self._place(seq)
        elif seq is None or seq.ended:
            raise invalid(f"inference request for sequence {corrid} to model '{self.model}' must specify the START "
                          "flag on the first request of the sequence")
        seq.ended = end
        seq.last_active = time.monotonic()
        request.arrival_ns = time.monotonic_ns()
        request.future = asyncio.get_running_loop().create_future()
        self._add_controls(request, corrid, start, end)
        seq.pending.append(request)
        self.pump()
        self._arm_idle_timer()
        return request.future

    def _add_controls(self, request: InferRequest, corrid, start: bool, end: bool) -> None:
        for name, control in self.controls:
            on = {Kind.CONTROL_SEQUENCE_START: start, Kind.CONTROL_SEQUENCE_END: end,
                  Kind.CONTROL_SEQUENCE_READY: True, Kind.CONTROL_SEQUENCE_CORRID: True}[control.kind]
            datatype, one = _control_value(control, on, corrid)
            rows = request.batch_size if self.batched else 1
            shape = [rows, 1] if self.batched else [1]
            request.inputs.append(Tensor(name, datatype, shape, one * rows))

    def _place(self, seq: Sequence) -> None:
        load = {id(i): 0 for i in self.pool.instances}
        for s in self.sequences.values():
            if s.instance is not None:
                load[id(s.instance)] += 1
        candidates = [i for i in self.pool.instances if load[id(i)] < self.per_instance]
        if candidates:
            seq.instance = min(candidates, key=lambda i: load[id(i)])
        else:
            self.backlog.append(seq)

    def _release(self, seq: Sequence) -> None:
        self.sequences.pop(seq.id, None)
        seq.instance = None
        while self.backlog:  # hand the freed place to the oldest waiting sequence
            waiting = self.backlog.popleft()
            if waiting.id in self.sequences:
                self._place(waiting)
                break

    def busy(self) -> bool:
        return any(s.pending or s.running for s in self.sequences.values())

    async def drained(self) -> None:
        await self._drain.wait()

    def pump(self) -> None:
        idle = self.pool.idle
        for seq in list(self.sequences.values()):
            if seq.running is not None or not seq.pending or seq.instance is None or seq.instance not in idle:
                continue
            idle.remove(seq.instance)
            request = seq.pending.popleft()
            seq.running = request
            request.future.add_done_callback(lambda _, s=seq: self._finished(s))
            seq.instance.run([request])
        self._drain.wake()

    def _finished(self, seq: Sequence) -> None:
        seq.running = None
        seq.last_active = time.monotonic()
        if seq.ended and not seq.pending:
            self._release(seq)
        self.pump()

    def _arm_idle_timer(self) -> None:
        if self._timer is None and self.sequences:
            self._timer = asyncio.get_running_loop().call_later(self.idle_secs, self._expire_idle)

    def _expire_idle(self) -> None:
        self._timer = None
        now = time.monotonic()
        for seq in list(self.sequences.values()):
            if seq.running is None and not seq.pending and now - seq.last_active >= self.idle_secs:
                log.info("sequence %s of model '%s' idled out after %.1fs", seq.id, self.model, self.idle_secs)
                self._release(seq)
        self.pump()  # a released place may let a waiting sequence run
        self._arm_idle_timer()

    def fail_all(self, error: Exception) -> None:
        for seq in list(self.sequences.values()):
            while seq.pending:
                end_unserved(seq.pending.popleft(), error)
