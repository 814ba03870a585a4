"""Worker processes of one model version: start each instance by exec, watch it, dispatch a batch
to an instance with credit, fail exactly its in-flight requests when it dies, restart it.

A model instance runs one batch at a time, as in Triton. While it runs one, the scheduler may send
it the next (`run_ahead`) when every instance is busy and that batch can grow no more: the worker
finds it waiting when it is done and goes on without sleeping, and the frontend's send does not
have to wake it. (Measured on a python model under wrk -c64 on 2 cores: about 3 µs less frontend
CPU and 2-3 µs less worker CPU per request, throughput up 5-15%.) So an instance has up to two
batches in flight, each with an input arena of its own (refilled from offset 0 for each batch) and
an output arena of its own (`OutputArenas`).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from ..core import InferRequest, InferResponse, RequestedOutput, Tensor
from ..errors import ServerError, Status
from ..logs import get_logger
from ..observability.custom_metrics import CustomMetrics
from ..observability.stats import ModelStats
from ..served import Infer, InferStream, ModelCall
from . import batching, transport
from .arena import Arena, segment_name
from .busy_poll import BusyPoll
from .channel import Channel
from .output_arenas import OutputArenas

log = get_logger("pool")
# a model's own log lines (pb_utils.Logger), by level; VERBOSE is Triton's verbose level 1
MODEL_LOG_LEVELS = {"INFO": logging.INFO, "WARNING": logging.WARNING, "ERROR": logging.ERROR,
                    "VERBOSE": logging.DEBUG}

_uids = itertools.count(1)
RESTART_DELAYS = (0.1, 0.5, 1.0, 2.0, 5.0, 10.0)
STABLE_SECS = 30.0
CRASH_LOOP_DEATHS = 5  # this many deaths (or failed restarts) within CRASH_LOOP_SECS: give up
CRASH_LOOP_SECS = 60.0
READINESS_TIMEOUT_S = 5.0  # how long a model's own readiness check may take, as in Triton's python backend


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


@dataclass
class InstanceSpec:
    name: str  # Triton's instance name, e.g. add_0_0
    kind: str  # "CPU" or "GPU"
    device_id: int  # GPU index for KIND_GPU, 0 otherwise


class LoadError(Exception):
    pass


def _describe_exit(code: int | None) -> str:
    if code is None:
        return "stopped answering"
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


class Instance:
    """One model instance: a slot that a worker process fills, incarnation after incarnation."""

    def __init__(self, pool: InstancePool, spec: InstanceSpec):
        self.pool = pool
        self.spec = spec
        self.model_log = get_logger(f"model.{spec.name}")  # the model's pb_utils.Logger lines
        self.proc: asyncio.subprocess.Process | None = None
        self.channel: Channel | None = None
        self.in_arenas: list[Arena] = []  # two: the batch in flight's, and the one sent ahead's
        self.outputs: OutputArenas | None = None
        self.ready: asyncio.Future | None = None
        self.batch: list[InferRequest] | None = None  # the batch the worker runs
        self.running_id = 0  # its batch id
        self.batch_in = 0  # the index of its input arena
        self.batch_out = 0  # the index of its output arena
        self.ahead: Ahead | None = None  # the batch sent to run next, if any
        self.batch_id = 0  # the last batch id given out
        self.sent_ns = 0
        self.encode_ns = 0
        self.alive = False
        self.started_at = 0.0
        self.restarts = 0
        self.deaths: list[float] = []  # when this instance died or failed to restart, recently
        self.stopping = False
        self.warming = False
        self.last_exit = ""
        self.gave_up = False
        self.kill_reason = ""  # why we killed the worker, when we did
        # requests that may be answered by STREAM messages (decoupled models, python models' response
        # senders), by (batch id, index in the batch), until their final response
        self.streams: dict[int, InferRequest] = {}  # by stream_key(batch id, index)
        self._deadline: asyncio.TimerHandle | None = None  # the progress watchdog of the batch in flight
        # the worker's decoupled BLS calls in progress, by number: the request each made
        self.calls: dict[int, InferRequest] = {}
        self.checks_readiness = False  # the model has a readiness check of its own (Ready.checks_readiness)
        self._check: asyncio.Future[str] | None = None  # the readiness check in flight: why not ready, or ""
        self._checks = 0  # the number of the last readiness check asked
        self._watch: asyncio.Task | None = None

    # -- lifecycle -------------------------------------------------------------------------
    async def start(self) -> None:
        """Start a worker and wait for READY. Raises LoadError with the worker's reason."""
        pool = self.pool
        uid = next(_uids)
        arena_bytes = pool.arena_bytes
        self.in_arenas = [Arena(segment_name(os.getpid(), f"{uid}-in{k or ''}"), arena_bytes, create=True)
                          for k in range(2)]
        self.outputs = OutputArenas(
            lambda k: Arena(segment_name(os.getpid(), f"{uid}-out{k or ''}"), arena_bytes, create=True))
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        spec = transport.WorkerSpec(
            fd=theirs.fileno(), parent_pid=os.getpid(),
            model_name=pool.model_name, model_version=pool.version, model_dir=pool.model_dir,
            backend=pool.backend, config_json=pool.config_json, instance_name=self.spec.name,
            kind=self.spec.kind, device_id=self.spec.device_id, in_arenas=[a.name for a in self.in_arenas],
            out_arenas=[a.name for a in self.outputs.all], arena_bytes=arena_bytes, log_verbose=pool.log_verbose,
            heap_retain_bytes=pool.heap_retain_bytes)
        env = dict(os.environ)
        env[transport.SPEC_ENV] = transport.encode_spec(spec)
        if self.spec.kind == "GPU":
            env["CUDA_VISIBLE_DEVICES"] = str(self.spec.device_id)
        elif self.spec.kind == "CPU":
            env["CUDA_VISIBLE_DEVICES"] = ""
        elif pool.gpus is not None:  # KIND_MODEL: every GPU the server may use
            env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in pool.gpus)
        loop = asyncio.get_running_loop()
        self.ready = loop.create_future()
        try:
            self.proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "tritonmp.workers.main", env=env, stdin=subprocess.DEVNULL,
                pass_fds=(theirs.fileno(),))
        except OSError as e:
            ours.close()
            self._release()
            raise LoadError(f"cannot start a worker process: {e}") from None
        finally:
            theirs.close()
        _, self.channel = await loop.connect_accepted_socket(
            lambda: Channel(self.on_message, self._on_channel_lost), ours)
        self._watch = loop.create_task(self._watch_exit(self.proc))
        try:
            ready = await asyncio.wait_for(asyncio.shield(self.ready), pool.load_timeout or None)
        except asyncio.TimeoutError:
            self.ready.cancel()
            self.kill_reason = "was killed while loading"
            self.proc.kill()
            self._release()
            raise LoadError(f"instance '{self.spec.name}' did not finish loading within {pool.load_timeout:g}s "
                            "(--model-load-timeout-secs)") from None
        except LoadError:
            self._release()
            raise
        # Both sides have mapped the arenas: drop their names so that nothing can be left behind.
        for arena in self.in_arenas:
            arena.unlink()
        self.outputs.unlink()
        try:
            await self._warmup()
        except LoadError:
            self._release()
            raise
        self.alive = True
        self.started_at = time.monotonic()
        log.info("worker %s of model '%s' version %d is ready (pid %d)%s", self.spec.name,
                 pool.model_name, pool.version, self.proc.pid, f"; {ready.detail}" if ready.detail else "")

    async def _warmup(self) -> None:
        """Run the model's warmup samples on this instance; any failure fails the load."""
        self.warming = True
        try:
            for name, count, template in self.pool.warmup:
                for _ in range(count):
                    request = InferRequest(template.model_name, "", template.id, list(template.inputs), None, {})
                    request.batch_size = template.batch_size
                    request.arrival_ns = time.monotonic_ns()
                    request.future = asyncio.get_running_loop().create_future()
                    self.run([request])
                    try:
                        await request.future
                    except ServerError as e:
                        self.proc.kill()
                        raise LoadError(f"warmup '{name}' failed on instance '{self.spec.name}': {e}") from None
        finally:
            self.warming = False

    def _on_channel_lost(self) -> None:
        proc = self.proc
        if proc is not None and proc.returncode is None and not self.stopping:
            proc.kill()  # a worker without its socket is of no use; its exit is handled as a death

    def _release(self) -> None:
        if self.channel is not None:
            self.channel.close()
            self.channel = None
        for arena in self.in_arenas:
            arena.close()
        if self.outputs is not None:
            self.outputs.close()
        self.in_arenas, self.outputs = [], None

    async def _watch_exit(self, proc) -> None:
        code = await proc.wait()
        if proc is not self.proc:
            return
        was_alive, self.alive = self.alive, False
        self.pool.custom_metrics.worker_gone(proc.pid)
        reason = self.kill_reason or _describe_exit(code)
        self.kill_reason = ""
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
        if self._check is not None and not self._check.done():
            self._check.set_result("Stub process is not healthy while waiting for user-defined is_ready() response")
        if self.ready is not None and not self.ready.done():
            # Triton's words for a model process that died while it loaded (its qa greps for them)
            self.ready.set_exception(LoadError(f"Stub process '{self.spec.name}' is not healthy. Its worker process "
                                               f"{reason} while loading"))
            return
        if not was_alive:
            return  # a failed load: start() has cleaned up and reports it
        self._release()
        then = "the server is shutting down" if self.stopping else "the instance is being restarted"
        if self.batch is not None:
            batch, self.batch = self.batch, None
            self._fail(batch, self.running_id, f"{reason} while running this request; {then}", proc.pid)
        if self.ahead is not None:
            ahead, self.ahead = self.ahead, None
            self._fail(ahead.batch, ahead.batch_id, f"{reason} before it could run this request; {then}", proc.pid)
        if self.streams:
            err = ServerError(f"model '{self.pool.model_name}' instance '{self.spec.name}' (pid {proc.pid}) {reason} "
                              "before sending its final response", Status.INTERNAL)
            streams, self.streams = self.streams, {}
            for request in streams.values():
                self._close_stream(request, err)
        self.pool.forget_idle(self)
        self.pool.on_idle()  # let the scheduler see that this batch is over
        if self.stopping:
            return
        self.last_exit = reason
        log.error("worker %s of model '%s' version %d (pid %d) %s; restarting it", self.spec.name,
                  self.pool.model_name, self.pool.version, proc.pid, reason)
        asyncio.get_running_loop().create_task(self._restart())

    def _fail(self, batch: list[InferRequest], batch_id: int, what: str, pid: int) -> None:
        """Answer the requests of a batch its worker's death has lost."""
        err = ServerError(f"model '{self.pool.model_name}' instance '{self.spec.name}' (pid {pid}) {what}",
                          Status.INTERNAL)
        now = time.monotonic_ns()
        for index, request in enumerate(batch):
            if request.stream is not None:
                continue  # ended with the open streams
            if self.pool.senders and self.streams.pop(stream_key(batch_id, index), None) is None:
                continue  # already answered through its response sender
            self.pool.stats.finished(False, request.batch_size, now - request.arrival_ns)
            if not request.future.done():
                request.future.set_exception(err)

    def _crash_looping(self, reason: str) -> bool:
        """Record a death; True (and the model told why) when the instance should stay down."""
        now = time.monotonic()
        self.deaths = [t for t in self.deaths if now - t < CRASH_LOOP_SECS] + [now]
        if len(self.deaths) < CRASH_LOOP_DEATHS:
            return False
        why = (f"instance '{self.spec.name}' died or failed to start {len(self.deaths)} times in "
               f"{CRASH_LOOP_SECS:.0f}s (last: {reason}); it is no longer restarted")
        log.error("model '%s' version %d: %s", self.pool.model_name, self.pool.version, why)
        self.pool.crash_looped(self, why)
        return True

    async def _restart(self) -> None:
        if time.monotonic() - self.started_at > STABLE_SECS:
            self.restarts = 0
        if self._crash_looping(self.last_exit):
            return
        while not self.stopping:
            delay = RESTART_DELAYS[min(self.restarts, len(RESTART_DELAYS) - 1)]
            self.restarts += 1
            self.pool.restart_count += 1
            await asyncio.sleep(delay)
            if self.stopping:
                return
            try:
                await self.start()
            except LoadError as e:
                log.error("restarting worker %s of model '%s' failed: %s", self.spec.name,
                          self.pool.model_name, e)
                if self._crash_looping(str(e).splitlines()[0] if str(e) else "load failed"):
                    return
                if not self.pool.any_alive():
                    # nothing can serve the queue until a restart succeeds: fail it rather than hang
                    self.pool.on_down(ServerError(
                        f"model '{self.pool.model_name}' version {self.pool.version} has no live instance: "
                        f"restarting '{self.spec.name}' failed: {e}", Status.UNAVAILABLE))
                continue
            self.pool.put_idle(self)
            return

    async def stop(self, deadline: float) -> None:
        self.stopping = True
        proc = self.proc
        if proc is None or proc.returncode is not None:
            self._release()
            return
        if self.channel is not None:
            self.channel.send(transport.STOP, b"")
        for sig in (None, signal.SIGTERM, signal.SIGKILL):
            if sig is not None and proc.returncode is None:
                proc.send_signal(sig)
            try:
                await asyncio.wait_for(proc.wait(), max(0.05, deadline - time.monotonic()))
                break
            except asyncio.TimeoutError:
                deadline = time.monotonic() + 2.0
        if self._watch is not None:
            await asyncio.gather(self._watch, return_exceptions=True)
        self._release()

    # -- readiness -------------------------------------------------------------------------
    async def readiness(self) -> str:
        """Why this instance is not ready, or "" when it is, as Triton's python backend says it: its
        worker must be running, and a model with a readiness check of its own (is_ready) must answer
        yes within READINESS_TIMEOUT_S. One check at a time: a caller that finds one in flight
        shares its answer. A check that takes too long goes on, and the next caller waits for it."""
        if not self.alive:
            if self.pool.backend == "python":  # Triton's words, which its qa greps the log for
                return f"Stub process '{self.spec.name}' is not healthy."
            return f"instance '{self.spec.name}' has no running worker process ({self.last_exit or 'starting'})"
        if not self.checks_readiness:
            return ""
        check = self._check
        if check is not None and not check.done():
            too_long = "Timed out waiting for in-flight is_ready() response"
        else:
            self._checks += 1
            check = self._check = asyncio.get_running_loop().create_future()
            self.channel.send(transport.READINESS, transport.encode(transport.ReadinessCheck(self._checks)), [])
            too_long = "Timed out waiting for user-defined is_ready() response"
        try:
            return await asyncio.wait_for(asyncio.shield(check), READINESS_TIMEOUT_S)
        except asyncio.TimeoutError:
            return too_long

    def _on_readiness(self, answer: transport.ReadinessResult) -> None:
        check = self._check
        if check is None or check.done() or answer.number != self._checks:
            return
        if answer.error:
            check.set_result(answer.error)
        else:
            check.set_result("" if answer.ready else f"Model '{self.spec.name}' is not ready (user-defined check "
                                                     "failed).")

    # -- messages from the worker ----------------------------------------------------------
    def on_message(self, kind: bytes, header: memoryview, frames: list[memoryview]) -> None:
        if kind == transport.RESULT:
            self._on_result(transport.decode(transport.Result, header), frames)
        elif kind == transport.STREAM:
            self._on_stream(transport.decode(transport.StreamResponse, header), frames)
        elif kind == transport.LOG:
            line = transport.decode(transport.Log, header)
            self.model_log.log(MODEL_LOG_LEVELS.get(line.level, logging.INFO), "%s", line.message)
        elif kind == transport.METRIC:
            update = transport.decode(transport.MetricUpdate, header)
            if update.op.startswith("delete"):
                self.pool.custom_metrics.delete(update.family, update.labels if update.op == "delete" else None,
                                                self.proc.pid)
            else:
                self.pool.custom_metrics.update(update.op, update.family, update.labels, update.value)
        elif kind == transport.BLS:
            request = transport.decode(transport.BlsRequest, header)
            if request.control.startswith("metric_"):  # answered at once, in order with the updates
                self._metric_call(request)
                return
            # the frames are views of this message's own buffer, which nothing else reuses
            asyncio.get_running_loop().create_task(self._bls(request, frames))
        elif kind == transport.BLS_CANCEL:
            # the model cancelled its decoupled call: the called model hears of it (is_cancelled()),
            # and its responses still come until its final one, as it decides
            called = self.calls.get(transport.decode(transport.BlsCancel, header).call)
            if called is not None and not called.future.done():
                called.future.cancel()
        elif kind == transport.READY:
            ready = transport.decode(transport.Ready, header)
            if ready.protocol != transport.PROTOCOL_VERSION:
                self.ready.set_exception(LoadError(f"worker speaks protocol {ready.protocol}, "
                                                   f"expected {transport.PROTOCOL_VERSION}"))
            elif not self.ready.done():
                self.checks_readiness = ready.checks_readiness
                self.ready.set_result(ready)
        elif kind == transport.READINESS_RESULT:
            self._on_readiness(transport.decode(transport.ReadinessResult, header))
        elif kind == transport.LOAD_FAILED:
            failed = transport.decode(transport.LoadFailed, header)
            if not self.ready.done():
                self.ready.set_exception(LoadError(failed.error))

    def _on_stream(self, msg: transport.StreamResponse, frames) -> None:
        """A response sent through a response sender (any number for a decoupled model, one for a
        python model that answers that way), for a request that may have finished executing."""
        key = stream_key(msg.batch_id, msg.index)
        request = self.streams.get(key)
        if request is None:
            return
        if not self.pool.decoupled:  # a python model's one response, sent through its response sender
            del self.streams[key]
            pool = self.pool
            self._answer(request, batching.decode_one(msg, request, frames, None, pool.output_types, pool.model_name,
                                                      str(pool.version)), pool.stats)
            return
        if msg.error:
            error = ServerError(msg.error, Status[msg.error_status] if msg.error_status in Status.__members__
                                else Status.INTERNAL)
            error.final = msg.final
            request.stream.put_nowait(error)
        elif not msg.empty:
            outputs = [Tensor(r.name, r.datatype, r.shape, frames[r.frame]) for r in msg.outputs
                       if request.outputs is None or r.name in {o.name for o in request.outputs}]
            request.stream.put_nowait(InferResponse(self.pool.model_name, str(self.pool.version), request.id,
                                                    outputs, dict(msg.parameters), final=msg.final))
        elif msg.final:  # the final flag alone: gRPC streams send it as an empty response when asked to
            request.stream.put_nowait(InferResponse(self.pool.model_name, str(self.pool.version), request.id,
                                                    [], final=True, empty=True))
        if msg.final:
            del self.streams[key]
            self._close_stream(request, None)

    def _close_stream(self, request: InferRequest, error: ServerError | None) -> None:
        if request.stream is None:  # a request that waited for its response sender's one response
            assert error is not None, "a request ends without a response only where it streams"
            self._answer(request, error, self.pool.stats, own_ok=not self.pool.merge)
            return
        ok = error is None
        self.pool.stats.finished(ok, request.batch_size, time.monotonic_ns() - request.arrival_ns,
                                 queue_ns=request.queue_ns)
        if error is not None:
            error.final = True
            request.stream.put_nowait(error)
        request.stream.put_nowait(None)
        if not request.future.done():
            request.future.set_result(None)

    def _metric_call(self, msg: transport.BlsRequest) -> None:
        """A model's new MetricFamily or Metric, or a Metric's value."""
        registry, args, pid = self.pool.custom_metrics, msg.control_args, self.proc.pid
        try:
            reply = transport.BlsResult()
            if msg.control == "metric_family_new":
                registry.family_new(args["name"], args["description"], args["kind"], self.pool, pid)
            elif msg.control == "metric_new":
                registry.metric_new(args["family"], args["labels"], args.get("buckets"), self.pool, pid)
            elif msg.control == "metric_value":
                reply.number = registry.value(args["family"], args["labels"])
            else:
                raise ServerError(f"unknown metric call '{msg.control}'", Status.INVALID_ARG)
        except ServerError as e:
            reply = transport.BlsResult(error=e.message, error_status=e.status.name)
        reply.call = msg.call
        self.channel.send(transport.BLS_RESULT, transport.encode(reply), [])

    async def _bls(self, msg: transport.BlsRequest, frames: list[memoryview]) -> None:
        """Serve a model's own request to another model, and answer on this worker's channel: once, or
        for a decoupled call with every response until the final one."""
        channel = self.channel

        def answer(reply: transport.BlsResult, reply_frames: list) -> None:
            reply.call = msg.call
            if channel is not None and channel is self.channel:
                channel.send(transport.BLS_RESULT, transport.encode(reply), reply_frames)

        try:
            if msg.control:
                if self.pool.control is None:
                    raise ServerError("model control is not available here", Status.UNAVAILABLE)
                value = await self.pool.control(msg.control, msg.model_name, msg.model_version, msg.control_args)
                answer(transport.BlsResult(value=value), [])
                return
            if self.pool.bls is None:
                raise ServerError("BLS requests are not available here", Status.UNAVAILABLE)
            inputs = [Tensor(r.name, r.datatype, list(r.shape), frames[r.frame]) for r in msg.inputs]
            outputs = [RequestedOutput(name) for name in msg.outputs] or None
            request = InferRequest(msg.model_name, msg.model_version, msg.id, inputs, outputs, msg.parameters)
            if msg.decoupled:
                self.calls[msg.call] = request
                try:
                    await self._bls_stream(request, answer)
                finally:
                    del self.calls[msg.call]
                return
            response = await self.pool.bls(request)
            answer(*_bls_result(response))
        except ServerError as e:
            answer(transport.BlsResult(error=e.message, error_status=e.status.name), [])
        except asyncio.CancelledError:  # the model cancelled its call before the called model had it
            answer(transport.BlsResult(error="Request for the model was cancelled", error_status="CANCELLED"), [])
        except Exception as e:  # a bug of ours must still answer, or the model would wait forever
            log.exception("BLS request from '%s' failed", self.spec.name)
            answer(transport.BlsResult(error=f"internal error: {type(e).__name__}: {e}"), [])

    async def _bls_stream(self, request: InferRequest, answer) -> None:
        """Every response of a decoupled BLS call, as it comes; the last carries the final flag."""
        final = False
        assert self.pool.bls_stream is not None, "the model manager lends every pool the dataplane's infer_stream"
        async for item in self.pool.bls_stream(request):
            if isinstance(item, ServerError):
                final = item.final
                answer(transport.BlsResult(error=item.message, error_status=item.status.name, final=final), [])
                continue
            reply, reply_frames = _bls_result(item)
            reply.final, reply.empty = item.final, item.empty
            final = item.final
            answer(reply, reply_frames)
        if not final:
            answer(transport.BlsResult(empty=True), [])

    # -- work ------------------------------------------------------------------------------
    def run(self, batch: list[InferRequest]) -> None:
        """Send a batch to run now: the instance has none in flight."""
        self.batch_id += 1
        if log.isEnabledFor(logging.DEBUG):
            log.debug("batch %d of %d request(s) %s to instance '%s' of model '%s'", self.batch_id, len(batch),
                      [r.id for r in batch], self.spec.name, self.pool.model_name)
        self.batch = batch
        self.running_id = self.batch_id
        now = time.monotonic_ns()
        self._watch_streams(batch, self.batch_id)
        self.batch_in, self.batch_out = 0, self.outputs.take()
        header, frames = batching.encode(self.batch_id, batch, self.pool.merge, self.in_arenas[0], self.batch_out)
        self.encode_ns = time.monotonic_ns() - now
        self._started(batch, now)
        self.channel.send(transport.EXECUTE, header, frames)
        self.pool.busy_poll.touch()  # the answer may be near: see it without a wake-up

    def can_run_ahead(self) -> bool:
        """Whether a batch can be sent to run after the one in flight."""
        return self.batch is not None and self.ahead is None and self.alive and not self.stopping \
            and not self.warming and self.outputs.spare()

    def run_ahead(self, batch: list[InferRequest]) -> None:
        """Send a batch to run when the one in flight is done (`can_run_ahead`). Its requests start
        (their queue time ends, their watchdog starts) then. A request cancelled before then must
        never run, as one cancelled in the queue: the scheduler sends ahead requests that can be
        cancelled only to a python model's worker, which hears of it (CANCEL, as for a running one),
        leaves the request out of the batch when it starts, and says so (Result.not_run)."""
        self.batch_id += 1
        if log.isEnabledFor(logging.DEBUG):
            log.debug("batch %d of %d request(s) %s sent ahead to instance '%s' of model '%s'", self.batch_id,
                      len(batch), [r.id for r in batch], self.spec.name, self.pool.model_name)
        started = time.monotonic_ns()
        self._watch_streams(batch, self.batch_id)
        in_arena, out_arena = 1 - self.batch_in, self.outputs.take()
        cancels = any(r.cancellable for r in batch)
        header, frames = batching.encode(self.batch_id, batch, self.pool.merge, self.in_arenas[in_arena], out_arena,
                                         in_arena, cancels)
        self.ahead = Ahead(batch, self.batch_id, in_arena, out_arena, time.monotonic_ns() - started)
        self.channel.send(transport.EXECUTE, header, frames)

    def _watch_streams(self, batch: list[InferRequest], batch_id: int) -> None:
        """Where a request may be answered through its response sender, or streams its responses:
        keep it by (batch id, index) until then, and watch for its client going."""
        if self.pool.decoupled or self.pool.senders:
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
        if self.pool.execution_timeout > 0:
            self._deadline = asyncio.get_running_loop().call_later(self.pool.execution_timeout, self._hung)

    def _next(self) -> None:
        """The batch in flight is done: start the one sent ahead, or wait for work."""
        ahead = self.ahead
        if ahead is None:
            self.pool.put_idle(self)
            return
        self.ahead = None
        self.batch, self.running_id, self.batch_in, self.batch_out = (ahead.batch, ahead.batch_id, ahead.in_arena,
                                                                      ahead.out_arena)
        self.encode_ns = ahead.encode_ns
        self._started(ahead.batch, time.monotonic_ns())
        self.pool.on_idle()  # the scheduler may send the next batch ahead

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
        if key in self.streams and self.channel is not None:
            self.channel.send(transport.CANCEL, transport.encode(transport.Cancel(key >> 32, key & 0xFFFFFFFF)), [])

    def _hung(self) -> None:
        """The progress watchdog: a batch that does not finish in time takes its worker down."""
        self._deadline = None
        proc = self.proc
        if self.batch is None or proc is None or proc.returncode is not None:
            return
        self.kill_reason = (f"did not finish a batch within {self.pool.execution_timeout:g}s "
                            "(--execution-timeout-secs) and was killed")
        log.error("worker %s of model '%s' version %d (pid %d) %s", self.spec.name, self.pool.model_name,
                  self.pool.version, proc.pid, self.kill_reason)
        proc.kill()

    def _on_result(self, result: transport.Result, frames) -> None:
        self.pool.busy_poll.touch()  # the client's next request may be near
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
        batch, self.batch = self.batch, None
        if batch is None or result.batch_id != self.running_id:
            return
        pool = self.pool
        if pool.decoupled:  # the responses come as STREAM messages; this only ends the execution
            pool.stats.executed(sum(r.batch_size for r in batch), 0 if result.error else len(batch),
                                self.encode_ns + result.input_ns, result.infer_ns, result.output_ns)
            if result.error:
                for index, request in enumerate(batch):
                    if self.streams.pop(stream_key(result.batch_id, index), None) is not None:
                        self._close_stream(request, ServerError(result.error, Status.INTERNAL))
            elif len(result.responses) == len(batch):
                for index, request in enumerate(batch):
                    if result.responses[index].rescheduled:
                        self._run_again(result.batch_id, index, request)
            self.outputs.done(self.batch_out)
            self._next()
            return
        stats = pool.stats if not self.warming else ModelStats("warmup", 0)  # warmup is not traffic
        started = time.monotonic_ns()
        read = self.outputs.reader(self.batch_out)
        try:
            responses = batching.decode(result, batch, pool.merge, frames, read, pool.output_types, pool.model_name,
                                        str(pool.version))
        finally:
            self.outputs.done(self.batch_out, read)
        now = time.monotonic_ns()
        # a python model's own error response counts as a success, as Triton's python backend counts it
        own_ok = not pool.merge
        failed = sum(1 for r in responses if isinstance(r, ServerError) and not (own_ok and r.from_model))
        not_run = result.not_run  # cancelled while their batch was sent ahead: counted nowhere, as if queued
        ran = batch
        if not_run:
            ran = [r for index, r in enumerate(batch) if index not in not_run]
            failed -= sum(1 for index in not_run if isinstance(missed := responses[index], ServerError)
                          and not (own_ok and missed.from_model))
        if ran:
            stats.executed(sum(r.batch_size for r in ran), len(ran) - failed, self.encode_ns + result.input_ns,
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
        deferred = pool.senders and not result.error and len(result.responses) == len(batch)
        for index, (request, response) in enumerate(zip(batch, responses)):
            if not_run and index in not_run:
                self.streams.pop(stream_key(result.batch_id, index), None)
                continue
            if pool.senders:
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


def _bls_result(response: InferResponse) -> tuple[transport.BlsResult, list]:
    refs: list[transport.TensorRef] = []
    frames: list = []
    for t in response.outputs:
        refs.append(transport.TensorRef(t.name, t.datatype, t.shape, frame=len(frames)))
        frames.append(t.data)
    return transport.BlsResult(outputs=refs), frames


NO_BUSY_POLL = BusyPoll(0)


class InstancePool:
    """The instances of one model version and the queue of those ready for work."""

    def __init__(self, model_name: str, version: int, model_dir: str, backend: str,
                 config_json: str, specs: list[InstanceSpec], output_types: dict[str, str],
                 arena_bytes: int, log_verbose: int = 0):
        self.model_name = model_name
        self.version = version
        self.model_dir = model_dir
        self.backend = backend
        self.config_json = config_json
        self.output_types = output_types
        self.arena_bytes = arena_bytes
        self.log_verbose = log_verbose
        self.merge = backend != "python"
        self.gpus: list[int] | None = None  # the server's GPUs, for KIND_MODEL instances
        self.execution_timeout = 0.0  # seconds a batch may run before its worker is killed; 0: no limit
        self.busy_poll = NO_BUSY_POLL  # the server's polling window (--busy-poll-us)
        self.decoupled = False  # responses stream back, any number per request
        self.senders = backend == "python"  # a request may be answered through its response sender
        self.load_timeout = 0.0  # seconds a worker may take to load before it is killed; 0: no limit
        self.heap_retain_bytes = 0  # memory a worker frees that it keeps for reuse (--worker-heap-retain-mb)
        self.bls: Infer | None = None  # the dataplane's infer, for models' own requests (BLS)
        self.bls_stream: InferStream | None = None  # the dataplane's infer_stream, for decoupled BLS requests
        self.custom_metrics = CustomMetrics()  # the server's, set by the model manager
        self.reschedule: Callable[[InferRequest], None] = lambda request: None  # the scheduler's, for iterative models
        self.control: ModelCall | None = None  # the dataplane's model_call, for models that load or unload models
        self.instances = [Instance(self, s) for s in specs]
        self.idle: deque[Instance] = deque()
        self.on_idle = lambda: None  # the scheduler's pump: an instance can take work
        self.on_down: Callable[[ServerError], None] = lambda error: None  # no instance can
        self.on_unavailable: Callable[[str], None] = lambda why: None  # the model version must go down
        self.restart_count = 0
        self.stats = ModelStats(model_name, version)
        self.warmup: list = []  # (sample name, count, request template), run by each instance before READY

    async def start(self) -> None:
        results = await asyncio.gather(*(i.start() for i in self.instances), return_exceptions=True)
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors:
            await self.stop(time.monotonic() + 5)
            first = errors[0]
            raise LoadError(str(first)) if not isinstance(first, LoadError) else first
        for instance in self.instances:
            self.idle.append(instance)

    def put_idle(self, instance: Instance) -> None:
        if instance.alive and instance not in self.idle:
            self.idle.append(instance)
        self.on_idle()

    def forget_idle(self, instance: Instance) -> None:
        try:
            self.idle.remove(instance)
        except ValueError:
            pass

    def crash_looped(self, instance: Instance, why: str) -> None:
        """An instance gave up; once all have, the model version goes UNAVAILABLE."""
        instance.gave_up = True
        if all(i.gave_up for i in self.instances):
            self.on_unavailable(why)
            self.on_down(ServerError(f"model '{self.model_name}' version {self.version} is unavailable: {why}",
                                     Status.UNAVAILABLE))

    def sent_ahead(self) -> int:
        """Requests sent to an instance to run after its batch in flight: still waiting, as those
        in the scheduler's queue are."""
        return sum(len(i.ahead.batch) for i in self.instances if i.ahead is not None)

    def any_alive(self) -> bool:
        return any(i.alive for i in self.instances)

    async def readiness(self) -> str:
        """Why the version is not ready to serve, or "" when it is: each instance must be (Triton's
        rule), and the first reason found, in the instances' order, is the answer."""
        if len(self.instances) == 1:
            return await self.instances[0].readiness()
        reasons = await asyncio.gather(*(i.readiness() for i in self.instances))
        return next((r for r in reasons if r), "")

    async def stop(self, deadline: float) -> None:
        await asyncio.gather(*(i.stop(deadline) for i in self.instances), return_exceptions=True)
        self.idle.clear()
        self.custom_metrics.drop_owner(self)  # the model's own metrics go with it
