"""The sequence batcher, for stateful models: every request carries a correlation ID; a sequence
holds a slot of one model instance from its START request to its END (or until it idles out), its
requests run in order, one at a time, and the model receives Triton's control inputs (START, END,
READY, CORRID) with each.

Requests of different sequences on one instance run together, by Triton's two strategies:

- **Direct** (the default): an instance has `max_batch_size` slots, and each sequence keeps its own
  slot, which is its row of every batch it is in. A batch carries the next request of every slot
  that has one, up to the highest such slot; a slot without one below it gets a placeholder row
  (a copy of another row with its data zeroed, READY false and CORRID 0) that runs but is answered
  and counted nowhere, so that every sequence stays in its row.
- **Oldest**: an instance has `max_candidate_sequences` slots, and the oldest next requests of its
  sequences are batched as the dynamic batcher batches (`preferred_batch_size`,
  `max_queue_delay_microseconds`), with no placeholders.

A sequence that finds no free slot waits in the backlog for the next slot to free up.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from tritonclient.grpc import model_config_pb2 as mc

from .. import datatypes, testing
from ..errors import invalid
from ..inference import InferRequest, Tensor
from ..instances.pool import Instance, InstancePool
from ..logs import get_logger
from .scheduler import BatchPolicy, DrainWaiters, end_unserved

log = get_logger("sequence")
Kind = mc.ModelSequenceBatching.Control


_keys = itertools.count(1)


@dataclass(eq=False)
class Sequence:
    id: object  # its correlation ID
    instance: Instance | None = None
    slot: int = -1  # its slot of that instance (-1: none yet, in the backlog)
    pending: deque = field(default_factory=deque)
    in_flight: int = 0  # its requests sent to the instance and not yet answered
    last_active: float = 0.0
    ended: bool = False  # its END request has come
    corrid: bytes | None = None  # its CORRID control's element, made once
    # which sequence it is to the worker keeping its implicit state: a START after the END of one
    # with the same correlation ID begins another, which may run while the first finishes
    key: int = field(default_factory=lambda: next(_keys))

    def busy(self) -> bool:
        return bool(self.pending) or self.in_flight > 0


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


@dataclass(frozen=True)
class _Control:
    """One control input as every request gets it: its values made once (CORRID's once per sequence)."""

    name: str
    kind: int
    datatype: str
    values: tuple[bytes, bytes]  # (false, true); CORRID's: (for no sequence, unused)
    config: Any  # its ModelSequenceBatching.Control

    @classmethod
    def of(cls, name: str, control) -> _Control:
        datatype, off = _control_value(control, False, 0)
        return cls(name, control.kind, datatype, (off, _control_value(control, True, 0)[1]), control)


def _zeros(t: Tensor) -> bytes:
    """A tensor of `t`'s type and shape, all zeros (BYTES: empty elements)."""
    count = datatypes.element_count(t.shape)
    return bytes(4 * count if t.datatype == "BYTES" else count * datatypes.ITEMSIZE[t.datatype])


def _retrieve(future: asyncio.Future) -> None:
    """A placeholder's outcome, which nobody awaits: looked at, so that no error of it is reported."""
    if not future.cancelled():
        future.exception()


def placeholder_rows(config: mc.ModelConfig) -> bool:
    """Whether the model's batches may hold placeholder rows (the Direct strategy's, between the
    slots of a batch with more than one), which run but are answered and counted nowhere."""
    if not config.HasField("sequence_batching") or config.sequence_batching.iterative_sequence:
        return False
    return config.sequence_batching.WhichOneof("strategy_choice") != "oldest" and config.max_batch_size > 1


class SequenceScheduler:
    def __init__(self, pool: InstancePool, config: mc.ModelConfig):
        self.pool = pool
        self.model = config.name
        sb = config.sequence_batching
        self.controls = [_Control.of(c.name, control) for c in sb.control_input for control in c.control]
        self.control_names = {c.name for c in self.controls}
        numeric = [mc.DataType.Name(c.config.data_type)[len("TYPE_"):] for c in self.controls
                   if c.kind == Kind.CONTROL_SEQUENCE_CORRID and c.config.data_type != mc.TYPE_STRING]
        self.numeric_corrid = numeric[0] if numeric else ""  # the CORRID input's numeric type, if it has one
        self.idle_secs = (sb.max_sequence_idle_microseconds or 1_000_000) / 1e6
        self.batched = config.max_batch_size > 0
        self.has_state = bool(sb.state)  # implicit state, kept by the worker: each row says whose it is
        self.released: dict[int, list] = {}  # instance -> sequences given up, whose state its worker may forget
        self.oldest = sb.WhichOneof("strategy_choice") == "oldest"
        if self.oldest:
            o = sb.oldest
            per_instance = max(1, o.max_candidate_sequences)
            self.policy = BatchPolicy(config.max_batch_size, self.batched, list(o.preferred_batch_size),
                                      o.max_queue_delay_microseconds * 1000)
        else:
            per_instance = max(1, config.max_batch_size)  # a slot is a row of the batch
            # a batch with fewer of its slots ready than this waits, up to the delay for its oldest request
            direct = sb.direct
            waits = direct.max_queue_delay_microseconds > 0 and direct.minimum_slot_utilization > 0
            self.min_utilization = direct.minimum_slot_utilization if waits else 0.0
            self.slot_delay_ns = direct.max_queue_delay_microseconds * 1000
        self.slots: dict[int, list[Sequence | None]] = {id(i): [None] * per_instance for i in pool.instances}
        # correlation ID -> its sequence, until its END comes (a START after that begins a new sequence)
        self.sequences: dict[object, Sequence] = {}
        self.live: dict[int, Sequence] = {}  # every sequence in a slot or the backlog, ended ones too
        self.backlog: deque[Sequence] = deque()  # started sequences waiting for a slot
        self._timer: asyncio.TimerHandle | None = None  # sequences idling out
        self._delay: asyncio.TimerHandle | None = None  # a batch waiting for its queue delay
        self._drain = DrainWaiters(self.busy)
        # Triton's qa hook: no batch until this many requests wait in slots and in the backlog
        self._hold_placed, self._hold_backlog = testing.scheduler_delays()
        pool.attach(self.pump, self.fail_all)

    @property
    def queue(self) -> list[InferRequest]:
        """Requests waiting (for metrics and draining)."""
        return [r for s in self.live.values() for r in s.pending]

    # -- requests ----------------------------------------------------------------------------
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
        if start and seq is not None:  # it keeps its slot: the new start runs after its requests
            log.warning("sequence %s of model '%s' started again before it ended", corrid, self.model)
        elif start:
            seq = Sequence(corrid)
            self.sequences[corrid] = seq
            self.live[id(seq)] = seq
            self._place(seq)
        elif seq is None:
            raise invalid(f"inference request for sequence {corrid} to model '{self.model}' must specify the START "
                          "flag on the first request of the sequence")
        if end:  # its correlation ID is free again: a START with it begins a new sequence, behind this one
            seq.ended = True
            del self.sequences[corrid]
        seq.last_active = time.monotonic()
        request.arrival_ns = time.monotonic_ns()
        request.future = asyncio.get_running_loop().create_future()
        if seq.corrid is None:
            seq.corrid = next((_control_value(c.config, True, corrid)[1] for c in self.controls
                               if c.kind == Kind.CONTROL_SEQUENCE_CORRID), b"")
        self._add_controls(request, seq.corrid, start, end, True)
        if self.has_state:
            request.sequence = [seq.key, start, end]
        seq.pending.append(request)
        self.pump()
        self._arm_idle_timer()
        return request.future

    def _add_controls(self, request: InferRequest, corrid: bytes | None, start: bool, end: bool, ready: bool) -> None:
        """The control inputs of one request (a sequence's requests are one row each); `corrid`: the
        sequence's CORRID element (None: a placeholder's, 0)."""
        shape = [1, 1] if self.batched else [1]
        for c in self.controls:
            kind = c.kind
            if kind == Kind.CONTROL_SEQUENCE_CORRID:
                data = c.values[0] if corrid is None else corrid
            else:
                on = start if kind == Kind.CONTROL_SEQUENCE_START else end if kind == Kind.CONTROL_SEQUENCE_END \
                    else ready
                data = c.values[on]
            request.inputs.append(Tensor(c.name, c.datatype, list(shape), data))

    def _placeholder(self, like: InferRequest) -> InferRequest:
        """A Direct batch's row for a slot with no request: `like`'s inputs with their data zeroed, READY
        false and CORRID 0 (the model may not read its other inputs while READY is false)."""
        inputs = [Tensor(t.name, t.datatype, list(t.shape), _zeros(t)) for t in like.inputs
                  if t.name not in self.control_names]
        null = InferRequest(like.model_name, like.model_version, "", inputs, like.outputs, {},
                            batch_size=like.batch_size, shape_key=like.shape_key, arrival_ns=time.monotonic_ns(),
                            null=True, cancellable=False)
        self._add_controls(null, None, False, False, False)
        if self.has_state:
            null.sequence = [None, False, False]
        null.future = asyncio.get_running_loop().create_future()
        null.future.add_done_callback(_retrieve)
        if self.pool.settings.decoupled:
            null.stream = asyncio.Queue()  # what the model sends it goes nowhere
        return null

    # -- slots -----------------------------------------------------------------------------
    def _place(self, seq: Sequence) -> None:
        """The lowest free slot of the instance with the most free slots, or the backlog."""
        best = None
        for instance in self.pool.instances:
            slots = self.slots[id(instance)]
            free = slots.count(None)
            if free and (best is None or free > best[0]):
                best = (free, instance, slots)
        if best is None:
            self.backlog.append(seq)
            return
        _, instance, slots = best
        seq.instance, seq.slot = instance, slots.index(None)
        slots[seq.slot] = seq

    def _release(self, seq: Sequence) -> None:
        """The sequence is over: its slot goes to the oldest sequence of the backlog."""
        if self.sequences.get(seq.id) is seq:
            del self.sequences[seq.id]
        self.live.pop(id(seq), None)
        if seq.instance is None:
            return
        self.slots[id(seq.instance)][seq.slot] = None
        seq.instance, seq.slot = None, -1
        while self.backlog:
            waiting = self.backlog.popleft()
            if id(waiting) in self.live:
                self._place(waiting)
                break

    # -- batches -----------------------------------------------------------------------------
    def busy(self) -> bool:
        return any(s.busy() for s in self.live.values())

    def keeps_state(self) -> bool:
        return bool(self.live)

    async def drained(self) -> None:
        await self._drain.wait()

    def pump(self) -> None:
        if self._hold_placed or self._hold_backlog:
            if self._held():
                return
            self._hold_placed = self._hold_backlog = 0
        pool = self.pool
        idle = pool.idle
        for instance in list(idle):
            slots = self.slots.get(id(instance))
            if slots is None:
                continue
            if pool.limiter is not None and not (self.backlog or any(s is not None and s.pending for s in slots)):
                continue  # nothing for it: it asks the rate limiter for nothing
            if not pool.may_run(instance):  # the rate limiter holds it back: its grant pumps again
                continue
            batch = self._oldest_batch(slots) if self.oldest else self._direct_batch(slots)
            if batch:
                idle.remove(instance)
                instance.run(batch, self.released.pop(id(instance), None))
        pool.settle()
        self._drain.wake()

    def _held(self) -> bool:
        """Whether fewer requests wait than Triton's qa hook asks for (testing.scheduler_delays)."""
        placed = sum(len(s.pending) for s in self.live.values() if s.instance is not None)
        waiting = sum(len(s.pending) for s in self.backlog if s.instance is None)
        return placed < self._hold_placed or (self._hold_backlog > 0 and waiting < self._hold_backlog)

    def _direct_batch(self, slots: list[Sequence | None]) -> list[InferRequest] | None:
        """The next request of every slot that has one, each in its slot's row, placeholders between;
        none yet while fewer slots than `minimum_slot_utilization` asks have one and the oldest of them
        has waited less than `max_queue_delay_microseconds`."""
        top, first, ready, oldest_ns = -1, None, 0, 0
        for index, seq in enumerate(slots):
            if seq is not None and seq.pending:
                top = index
                ready += 1
                if first is None:
                    first = seq.pending[0]
                    oldest_ns = first.arrival_ns
                else:
                    oldest_ns = min(oldest_ns, seq.pending[0].arrival_ns)
        if first is None:
            return None
        if ready / len(slots) < self.min_utilization:
            due_ns = oldest_ns + self.slot_delay_ns
            now_ns = time.monotonic_ns()
            if now_ns <= due_ns:
                if self._delay is None:
                    self._delay = asyncio.get_running_loop().call_later((due_ns - now_ns) / 1e9 + 1e-4,
                                                                        self._delay_over)
                return None
        batch = []
        for index in range(top + 1):
            seq = slots[index]
            # a request whose shapes differ from the batch's waits for a later one
            if seq is not None and seq.pending and seq.pending[0].shape_key == first.shape_key:
                batch.append(self._take(seq))
            else:
                batch.append(self._placeholder(first))
        return batch

    def _oldest_batch(self, slots: list[Sequence | None]) -> list[InferRequest] | None:
        """The oldest next requests of the instance's sequences, batched by the dynamic batcher's rules."""
        heads = sorted((seq.pending[0].arrival_ns, seq.slot, seq) for seq in slots if seq is not None and seq.pending)
        if not heads:
            return None
        queue = deque(seq.pending[0] for _, _, seq in heads)
        owner = {id(seq.pending[0]): seq for _, _, seq in heads}
        taken, wake_ns = self.policy.take(queue, time.monotonic_ns())
        if taken is None:
            if wake_ns is not None and self._delay is None:
                delay = max(0.0, (wake_ns - time.monotonic_ns()) / 1e9)
                self._delay = asyncio.get_running_loop().call_later(delay, self._delay_over)
            return None
        return [self._take(owner[id(request)]) for request in taken]

    def _delay_over(self) -> None:
        self._delay = None
        self.pump()

    def _take(self, seq: Sequence) -> InferRequest:
        """A sequence's next request, into a batch; a sequence whose END goes gives up its slot, which
        the next batch of the instance may fill (it runs after this one)."""
        request = seq.pending.popleft()
        seq.in_flight += 1
        request.future.add_done_callback(lambda _: self._answered(seq))
        if seq.ended and not seq.pending:
            self._release(seq)
        return request

    def _answered(self, seq: Sequence) -> None:
        seq.in_flight -= 1
        seq.last_active = time.monotonic()
        if not seq.busy():
            self._drain.wake()

    # -- idle sequences, failures ----------------------------------------------------------------
    def _arm_idle_timer(self) -> None:
        """A timer for when the sequence idle longest would idle out (one that runs counts as active now)."""
        if self._timer is None and self.live:
            now = time.monotonic()
            due = min(now if s.busy() else s.last_active for s in self.live.values()) + self.idle_secs
            self._timer = asyncio.get_running_loop().call_later(max(0.0, due - now), self._expire_idle)

    def _expire_idle(self) -> None:
        self._timer = None
        now = time.monotonic()
        for seq in list(self.live.values()):
            if not seq.busy() and now - seq.last_active >= self.idle_secs:
                log.info("sequence %s of model '%s' idled out after %.1fs", seq.id, self.model, self.idle_secs)
                if self.has_state and seq.instance is not None:
                    self.released.setdefault(id(seq.instance), []).append(seq.key)
                self._release(seq)
        self.pump()  # a released slot may let a waiting sequence run
        self._arm_idle_timer()

    def fail_all(self, error: Exception) -> None:
        for seq in list(self.live.values()):
            while seq.pending:
                end_unserved(seq.pending.popleft(), error)
