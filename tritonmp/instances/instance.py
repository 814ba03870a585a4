"""A model instance: its worker process (worker_process.WorkerProcess: start, restart, stop,
readiness), and its batches: sent to the worker (one at a time, as in Triton, and one more sent
ahead), watched by a progress watchdog, answered from the worker's result or, where the model
answers through response senders or streams (decoupled models), from its STREAM messages; a
client's cancellation reaches the worker; a death fails exactly what the worker had.

While an instance runs one batch, the scheduler may send it the next (`run_ahead`) when every
instance is busy and that batch can grow no more: the worker finds it waiting when it is done and
goes on without sleeping, and the frontend's send does not have to wake it
(docs/performance.md). So an instance has up to two batches in flight, each with an input arena of
its own (refilled from offset 0 for each batch) and an output arena of its own (`OutputArenas`).

An instance is told how to run (contract.InstanceSettings, the same for every instance of a
version), tells its pool what happens through PoolHooks, and shows itself as a
contract.InstanceSnapshot."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Protocol

from ..errors import ServerError, Status
from ..host_policy import format_cores
from ..inference import InferRequest, InferResponse, Tensor
from ..ipc import batching, transport
from ..logs import get_logger
from ..observability.stats import ModelStats
from .contract import InstanceSettings, InstanceSnapshot
from .model_calls import ModelCalls, ModelServices
from .worker_process import InstanceSpec, LaunchSpec, LoadError, WorkerProcess

log = get_logger("pool")
# a model's own log lines (pb_utils.Logger), by level; VERBOSE is Triton's verbose level 1
MODEL_LOG_LEVELS = {"INFO": logging.INFO, "WARNING": logging.WARNING, "ERROR": logging.ERROR,
                    "VERBOSE": logging.DEBUG}
class PoolHooks(Protocol):
    """What an instance tells the pool it belongs to."""

    def ready(self, instance: Instance) -> None:
        """The instance can take a batch."""

    def lost(self, instance: Instance) -> None:
        """The instance's worker died: it can take nothing until it is back."""

    def progressed(self) -> None:
        """A batch is done, and the instance runs the one sent ahead: another may be sent ahead."""

    def reschedule(self, request: InferRequest) -> None:
        """The model asked to run the request again (iterative sequences)."""

    def gave_up(self, why: str) -> None:
        """The instance's restarts are given up."""

    def restart_failed(self, instance: Instance, error: LoadError) -> None:
        """A restart of the instance's worker failed."""


@dataclass(slots=True)
class Ahead:
    """A batch sent to an instance while another runs there."""

    batch: list[InferRequest]
    batch_id: int
    in_arena: int  # the index of its input arena
    out_arena: int  # the index of its output arena
    encode_ns: int


def stream_key(batch_id: int, index: int) -> int:
    """A request's key among an instance's open streams: its batch id and its index in that batch,
    as one int (no tuple made and freed per request)."""
    return batch_id << 32 | index


class Instance:
    """One model instance: its worker process, the batches the worker runs, and their answers."""

    def __init__(self, launch: LaunchSpec, spec: InstanceSpec, settings: InstanceSettings, stats: ModelStats,
                 services: ModelServices, pool: PoolHooks):
        self.spec = spec
        self.settings = settings
        self.stats = stats
        self.pool = pool
        self.services = services
        self.worker = WorkerProcess(launch, spec, self)
        self.model_log = get_logger(f"model.{spec.name}")  # the model's pb_utils.Logger lines
        self.batch: list[InferRequest] | None = None  # the batch the worker runs
        self.running_id = 0  # its batch id
        self.batch_in = 0  # the index of its input arena
        self.batch_out = 0  # the index of its output arena
        self.ahead: Ahead | None = None  # the batch sent to run next, if any
        self.batch_id = 0  # the last batch id given out
        self.sent_ns = 0
        self.encode_ns = 0
        self.warming = False
        # requests that may be answered by STREAM messages (decoupled models, python models' response
        # senders), by (batch id, index in the batch), until their final response
        self.streams: dict[int, InferRequest] = {}  # by stream_key(batch id, index)
        self._deadline: asyncio.TimerHandle | None = None  # the progress watchdog of the batch in flight
        # the worker's own calls: BLS, model control, custom metrics; its metrics are the pool's
        self.model_calls = ModelCalls(spec.name, services, pool, lambda: self.worker.channel, self._pid,
                                      settings.namespace)

    def _pid(self) -> int:
        proc = self.worker.proc
        return proc.pid if proc is not None else 0

    # -- the worker process ----------------------------------------------------------------
    @property
    def alive(self) -> bool:
        return self.worker.alive

    @property
    def gave_up(self) -> bool:
        return self.worker.gave_up

    async def start(self) -> None:
        await self.worker.start()

    async def stop(self, deadline: float) -> None:
        await self.worker.stop(deadline)

    async def readiness(self) -> str:
        return await self.worker.readiness()

    def snapshot(self) -> InstanceSnapshot:
        w = self.worker
        pid = w.proc.pid if w.proc is not None and w.alive else None
        return InstanceSnapshot(self.spec.name, self.spec.kind, self.spec.device_id, pid, w.alive,
                                self.batch is not None, len(self.batch) if self.batch is not None else 0,
                                w.restarts, w.restarts_total, w.last_exit, w.gave_up,
                                time.monotonic() - w.started_at if w.alive else None,
                                format_cores(self.spec.placement.cores))

    # -- what the worker process tells (WorkerEvents) --------------------------------------
    def exited(self, pid: int, reason: str, serving: bool) -> None:
        """The worker has exited: its batch's watchdog has nothing left to watch, its model's metrics
        lose its values, and, where it was serving (or warming up), what it had is answered."""
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
        self.services.custom_metrics.worker_gone(pid)
        if serving or self.warming:
            self._lost(reason, pid)

    def back(self) -> None:
        self.pool.ready(self)

    def given_up(self, why: str) -> None:
        self.pool.gave_up(why)

    def restart_failed(self, error: LoadError) -> None:
        self.pool.restart_failed(self, error)

    def _lost(self, reason: str, pid: int) -> None:
        """The worker (pid) has died for `reason`: answer what it had, and end its open streams."""
        then = "its load fails" if self.warming else "the server is shutting down" if self.worker.stopping \
            else "the instance is being restarted"
        if self.batch is not None:
            batch, self.batch = self.batch, None
            self._fail(batch, self.running_id, f"{reason} while running this request; {then}", pid)
        if self.ahead is not None:
            ahead, self.ahead = self.ahead, None
            self._fail(ahead.batch, ahead.batch_id, f"{reason} before it could run this request; {then}", pid)
        if self.streams:
            err = ServerError(f"model '{self.settings.model_name}' instance '{self.spec.name}' (pid {pid}) {reason} "
                              "before sending its final response", Status.INTERNAL)
            streams, self.streams = self.streams, {}
            for request in streams.values():
                self._close_stream(request, err)
        if not self.warming:
            self.pool.lost(self)

    async def warm_up(self) -> None:
        """Run the model's warmup samples on this instance; any failure fails the load."""
        self.warming = True
        try:
            for name, count, template in self.settings.warmup:
                for _ in range(count):
                    request = InferRequest(template.model_name, "", template.id, list(template.inputs), None, {})
                    request.batch_size = template.batch_size
                    request.arrival_ns = time.monotonic_ns()
                    request.future = asyncio.get_running_loop().create_future()
                    self.run([request])
                    try:
                        await request.future
                    except ServerError as e:
                        self.worker.kill("failed its warmup")
                        raise LoadError(f"warmup '{name}' failed on instance '{self.spec.name}': {e}") from None
        finally:
            self.warming = False

    def _fail(self, batch: list[InferRequest], batch_id: int, what: str, pid: int) -> None:
        """Answer the requests of a batch its worker's death has lost."""
        err = ServerError(f"model '{self.settings.model_name}' instance '{self.spec.name}' (pid {pid}) {what}",
                          Status.INTERNAL)
        now = time.monotonic_ns()
        for index, request in enumerate(batch):
            if request.stream is not None:
                continue  # ended with the open streams
            if self.settings.senders and self.streams.pop(stream_key(batch_id, index), None) is None:
                continue  # already answered through its response sender
            if request.null:
                continue  # a placeholder row: answered and counted nowhere
            if not self.warming:  # warmup is not traffic
                self.stats.finished(False, request.batch_size, now - request.arrival_ns)
            if not request.future.done():
                request.future.set_exception(err)

    # -- messages from the worker ----------------------------------------------------------
    def on_message(self, kind: bytes, header: memoryview, frames: list[memoryview]) -> None:
        if kind == transport.RESULT:
            result = transport.decode(transport.Result, header)
            if self.settings.reshapes is not None:  # the outputs in the shapes the client is given
                for response in result.responses:
                    self.settings.reshapes.refs_to_client(response.outputs)
            self._on_result(result, frames)
        elif kind == transport.STREAM:
            stream = transport.decode(transport.StreamResponse, header)
            if self.settings.reshapes is not None:
                self.settings.reshapes.refs_to_client(stream.outputs)
            self._on_stream(stream, frames)
        elif kind == transport.LOG:
            line = transport.decode(transport.Log, header)
            self.model_log.log(MODEL_LOG_LEVELS.get(line.level, logging.INFO), "%s", line.message)
        elif kind in (transport.BLS, transport.BLS_CANCEL, transport.METRIC):
            self.model_calls.on_message(kind, header, frames)

    def _on_stream(self, msg: transport.StreamResponse, frames) -> None:
        """A response sent through a response sender (any number for a decoupled model, one for a
        python model that answers that way), for a request that may have finished executing."""
        key = stream_key(msg.batch_id, msg.index)
        request = self.streams.get(key)
        if request is None:
            return
        if not self.settings.decoupled:  # a python model's one response, sent through its response sender
            del self.streams[key]
            s = self.settings
            self._answer(request, batching.decode_one(msg, request, frames, None, s.output_types, s.model_name,
                                                      str(s.version)), self.stats)
            return
        stream = request.stream
        assert stream is not None, "a decoupled model's request streams its responses"
        if not request.responded and not msg.empty and self.stats.latency is not None:
            request.responded = True
            self.stats.first_response(time.monotonic_ns() - request.arrival_ns)
        if msg.error:
            error = ServerError(msg.error, Status[msg.error_status] if msg.error_status in Status.__members__
                                else Status.INTERNAL)
            error.final = msg.final
            stream.put_nowait(error)
        elif not msg.empty:
            outputs = [Tensor(r.name, r.datatype, r.shape, frames[r.frame]) for r in msg.outputs
                       if request.outputs is None or r.name in {o.name for o in request.outputs}]
            stream.put_nowait(InferResponse(self.settings.model_name, str(self.settings.version), request.id, outputs,
                                            dict(msg.parameters), final=msg.final))
        elif msg.final:  # the final flag alone: gRPC streams send it as an empty response when asked to
            stream.put_nowait(InferResponse(self.settings.model_name, str(self.settings.version), request.id, [],
                                            final=True, empty=True))
        if msg.final:
            del self.streams[key]
            self._close_stream(request, None)

    def _close_stream(self, request: InferRequest, error: ServerError | None) -> None:
        if request.stream is None:  # a request that waited for its response sender's one response
            assert error is not None, "a request ends without a response only where it streams"
            self._answer(request, error, self.stats, own_ok=not self.settings.merge)
            return
        ok = error is None
        self.stats.finished(ok, request.batch_size, time.monotonic_ns() - request.arrival_ns,
                                 queue_ns=request.queue_ns)
        if error is not None:
            error.final = True
            request.stream.put_nowait(error)
        request.stream.put_nowait(None)
        if not request.future.done():
            request.future.set_result(None)

    # -- work ------------------------------------------------------------------------------
    def run(self, batch: list[InferRequest], released: list | None = None) -> None:
        """Send a batch to run now: the instance has none in flight. `released`: sequences whose implicit
        state the worker may forget."""
        self.batch_id += 1
        if log.isEnabledFor(logging.DEBUG):
            log.debug("batch %d of %d request(s) %s to instance '%s' of model '%s'", self.batch_id, len(batch),
                      [r.id for r in batch], self.spec.name, self.settings.model_name)
        self.batch = batch
        self.running_id = self.batch_id
        now = time.monotonic_ns()
        self._watch_streams(batch, self.batch_id)
        channel, outputs = self.worker.wire()
        self.batch_in, self.batch_out = 0, outputs.take()
        s = self.settings
        header, frames = batching.encode(self.batch_id, batch, s.merge, self.worker.in_arenas[0], self.batch_out,
                                         reshapes=s.reshapes, released=released, ragged=s.ragged)
        self.encode_ns = time.monotonic_ns() - now
        self._started(batch, now)
        channel.send(transport.EXECUTE, header, frames)
        self.settings.busy_poll.touch()  # the answer may be near: see it without a wake-up

    def can_run_ahead(self) -> bool:
        """Whether a batch can be sent to run after the one in flight."""
        outputs = self.worker.outputs
        return self.batch is not None and self.ahead is None and self.worker.alive and not self.worker.stopping \
            and not self.warming and outputs is not None and outputs.spare()

    def run_ahead(self, batch: list[InferRequest]) -> None:
        """Send a batch to run when the one in flight is done (`can_run_ahead`). Its requests start
        (their queue time ends, their watchdog starts) then. A request cancelled before then must
        never run, as one cancelled in the queue: the scheduler sends ahead requests that can be
        cancelled only to a python model's worker, which hears of it (CANCEL, as for a running one),
        leaves the request out of the batch when it starts, and says so (Result.not_run)."""
        self.batch_id += 1
        if log.isEnabledFor(logging.DEBUG):
            log.debug("batch %d of %d request(s) %s sent ahead to instance '%s' of model '%s'", self.batch_id,
                      len(batch), [r.id for r in batch], self.spec.name, self.settings.model_name)
        started = time.monotonic_ns()
        self._watch_streams(batch, self.batch_id)
        channel, outputs = self.worker.wire()
        in_arena, out_arena = 1 - self.batch_in, outputs.take()
        cancels = any(r.cancellable for r in batch)
        s = self.settings
        header, frames = batching.encode(self.batch_id, batch, s.merge, self.worker.in_arenas[in_arena], out_arena,
                                         in_arena, cancels, s.reshapes, ragged=s.ragged)
        self.ahead = Ahead(batch, self.batch_id, in_arena, out_arena, time.monotonic_ns() - started)
        channel.send(transport.EXECUTE, header, frames)

    def _watch_streams(self, batch: list[InferRequest], batch_id: int) -> None:
        """Where a request may be answered through its response sender, or streams its responses:
        keep it by (batch id, index) until then, and watch for its client going."""
        if self.settings.decoupled or self.settings.senders:
            watch = self._watch_cancel
            for index, request in enumerate(batch):
                self.streams[stream_key(batch_id, index)] = request
                if request.cancellable:
                    request.future.add_done_callback(watch)

    def _started(self, batch: list[InferRequest], now: int) -> None:
        """The batch in flight starts running: its requests' queue time ends, and its watchdog starts."""
        self.sent_ns = now
        for request in batch:
            request.queue_ns = now - request.arrival_ns
            if request.trace is not None:
                request.trace.mark("COMPUTE_START", now)
        if self.settings.execution_timeout > 0:
            self._deadline = asyncio.get_running_loop().call_later(self.settings.execution_timeout, self._hung)

    def _next(self) -> None:
        """The batch in flight is done: start the one sent ahead, or wait for work."""
        ahead = self.ahead
        if ahead is None:
            self.pool.ready(self)
            return
        self.ahead = None
        self.batch, self.running_id, self.batch_in, self.batch_out = (ahead.batch, ahead.batch_id, ahead.in_arena,
                                                                      ahead.out_arena)
        self.encode_ns = ahead.encode_ns
        self._started(ahead.batch, time.monotonic_ns())
        self.pool.progressed()  # the scheduler may send the next batch ahead

    def _run_again(self, batch_id: int, index: int, request: InferRequest) -> None:
        """The model rescheduled the request (iterative sequences): back to the front of the queue, its
        client still waiting."""
        self.streams.pop(stream_key(batch_id, index), None)
        if request.future.done():
            return  # its client has gone
        self.pool.reschedule(request)

    def _watch_cancel(self, future: asyncio.Future) -> None:
        """The done-callback of a request the model has: if its client has gone, the worker is told,
        and its model sees is_cancelled(). (Answered from the batch's result, the callback is taken off
        before it runs: see _on_result.)"""
        if future.cancelled():
            for key, request in list(self.streams.items()):  # cancellations are rare: no index kept
                if request.future is future:
                    self._cancel(key)

    def _cancel(self, key: int) -> None:
        """Tell the worker that the request `key` (its stream_key) is cancelled."""
        channel = self.worker.channel
        if key in self.streams and channel is not None:
            channel.send(transport.CANCEL, transport.encode(transport.Cancel(key >> 32, key & 0xFFFFFFFF)), [])

    def _hung(self) -> None:
        """The progress watchdog: a batch that does not finish in time takes its worker down."""
        self._deadline = None
        proc = self.worker.proc
        if self.batch is None or proc is None or proc.returncode is not None:
            return
        reason = (f"did not finish a batch within {self.settings.execution_timeout:g}s "
                  "(--execution-timeout-secs) and was killed")
        log.error("worker %s of model '%s' version %d (pid %d) %s", self.spec.name, self.settings.model_name,
                  self.settings.version, proc.pid, reason)
        self.worker.kill(reason)

    def _on_result(self, result: transport.Result, frames) -> None:
        self.settings.busy_poll.touch()  # the client's next request may be near
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
        batch, self.batch = self.batch, None
        if batch is None or result.batch_id != self.running_id:
            return
        settings = self.settings
        if settings.decoupled:  # the responses come as STREAM messages; this only ends the execution
            real = [r for r in batch if not r.null] if settings.null_rows else batch
            # placeholder rows count in the batch's size, as Triton counts its null requests, but not as requests
            self.stats.executed(sum(r.batch_size for r in batch), 0 if result.error else len(real),
                                self.encode_ns + result.input_ns, result.infer_ns, result.output_ns)
            if result.error:
                for index, request in enumerate(batch):
                    if self.streams.pop(stream_key(result.batch_id, index), None) is not None:
                        self._close_stream(request, ServerError(result.error, Status.INTERNAL))
            elif len(result.responses) == len(batch):
                for index, request in enumerate(batch):
                    if result.responses[index].rescheduled:
                        self._run_again(result.batch_id, index, request)
            self.worker.wire()[1].done(self.batch_out)
            self._next()
            return
        stats = self.stats if not self.warming else ModelStats("warmup", 0)  # warmup is not traffic
        started = time.monotonic_ns()
        outputs = self.worker.wire()[1]
        read = outputs.reader(self.batch_out)
        try:
            responses = batching.decode(result, batch, settings.merge, frames, read, settings.output_types,
                                        settings.model_name, str(settings.version), settings.ragged)
        finally:
            outputs.done(self.batch_out, read)
        now = time.monotonic_ns()
        # a python model's own error response counts as a success, as Triton's python backend counts it
        own_ok = not settings.merge
        failed = sum(1 for r in responses if isinstance(r, ServerError) and not (own_ok and r.from_model))
        not_run = result.not_run  # cancelled while their batch was sent ahead: counted nowhere, as if queued
        ran = batch
        if not_run:
            ran = [r for index, r in enumerate(batch) if index not in not_run]
            failed -= sum(1 for index in not_run if isinstance(missed := responses[index], ServerError)
                          and not (own_ok and missed.from_model))
        rows = sum(r.batch_size for r in ran)  # placeholder rows count in the batch's size, as Triton's null requests
        if settings.null_rows:  # but not as requests
            failed -= sum(1 for r, response in zip(batch, responses) if r.null and isinstance(response, ServerError)
                          and not (own_ok and response.from_model))
            ran = [r for r in ran if not r.null]
        if ran:
            stats.executed(rows, len(ran) - failed, self.encode_ns + result.input_ns,
                           result.infer_ns, result.output_ns + now - started)
        for request in ran:
            if request.trace is not None:
                t = request.trace
                t.mark("COMPUTE_INPUT_END", self.sent_ns + self.encode_ns + result.input_ns)
                t.mark("COMPUTE_OUTPUT_START", now - (now - started) - result.output_ns)
                t.mark("COMPUTE_END", now)
        if log.isEnabledFor(logging.DEBUG):
            log.debug("batch %d done on instance '%s': input %.0fus, infer %.0fus, output %.0fus%s", result.batch_id,
                      self.spec.name, result.input_ns / 1e3, result.infer_ns / 1e3, result.output_ns / 1e3,
                      f"; failed: {result.error}" if result.error else "")
        deferred = settings.senders and not result.error and len(result.responses) == len(batch)
        for index, (request, response) in enumerate(zip(batch, responses)):
            if request.null:
                self.streams.pop(stream_key(result.batch_id, index), None)
                continue
            if not_run and index in not_run:
                self.streams.pop(stream_key(result.batch_id, index), None)
                continue
            if settings.senders:
                if deferred and result.responses[index].rescheduled:
                    self._run_again(result.batch_id, index, request)
                    continue
                if deferred and result.responses[index].deferred:
                    continue  # answered through its response sender, already or later
                if self.streams.pop(stream_key(result.batch_id, index), None) is None:
                    continue  # already answered through its response sender
                if request.cancellable:
                    request.future.remove_done_callback(self._watch_cancel)  # its client is answered here
            self._answer(request, response, stats, now, own_ok)
        self._next()

    @staticmethod
    def _answer(request: InferRequest, response: InferResponse | ServerError, stats: ModelStats,
                now: int = 0, own_ok: bool = False) -> None:
        """Settle a request's future; `own_ok`: the model's own error response counts as a success."""
        stats.finished(not isinstance(response, ServerError) or (own_ok and response.from_model), request.batch_size,
                       (now or time.monotonic_ns()) - request.arrival_ns, queue_ns=request.queue_ns)
        if request.future.done():
            return
        if isinstance(response, ServerError):
            request.future.set_exception(response)
        else:
            request.future.set_result(response)
