"""The worker process: load one backend for one model instance, then run the batches the
frontend sends until told to stop.

Started by the frontend with a clean exec (`python -m tritonmp.workers.main`), or forked from a
worker template (template.py); either way, the first message on its socket is its spec. It speaks only the transport
protocol: no HTTP, JSON or protobuf parsing.
"""

from __future__ import annotations

import ctypes
import gc
import importlib
import json
import os
import signal
import socket
import sys
import threading
import time
import traceback
from collections import deque

import numpy as np

from tritonmp import backends, datatypes, host_policy
from tritonmp.host_policy import Placement
from tritonmp.ipc import transport
from tritonmp.ipc.arena import Arena

from .backend import Backend, BackendError, WorkerHost, WorkRequest, WorkResponse, WorkTensor
from .client_shm import ClientRegions
from .cuda_shm import CudaRegions
from .heap import HeapRetention
from .inbox import Inbox
from .sequence_state import SequenceStates

PR_SET_PDEATHSIG = 1
PR_SET_NAME = 15


class OutputError(Exception):
    """An output that cannot be returned as the request asked."""


def die_with_parent(parent_pid: int) -> None:
    """Ask the kernel to kill us when the frontend dies, then check it has not died already."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except OSError:
        pass
    if os.getppid() != parent_pid:
        os._exit(3)


def set_process_name(name: str) -> None:
    """The name `top` and `ps -o comm` show for this process (15 bytes at most): a forked worker's
    command line is its template's, so this is what tells them apart."""
    try:
        ctypes.CDLL("libc.so.6").prctl(PR_SET_NAME, name.encode()[:15], 0, 0, 0)
    except OSError:
        pass




def load_backend(spec: transport.WorkerSpec, config: dict, host: WorkerHost) -> Backend:
    """The instance's backend, prepared (`Backend.prepare`) and then built with its model loaded."""
    described = backends.get(spec.backend)
    if described is None or not described.worker:
        raise BackendError(f"backend '{spec.backend}' is not available in this server")
    module, name = described.worker.split(":")  # imported only by the worker that runs it
    cls: type[Backend] = getattr(importlib.import_module(f".{module}", __package__), name)
    cls.prepare(host)
    return cls(spec, config)


class Worker:
    def __init__(self, spec: transport.WorkerSpec):
        self.spec = spec
        self.heap = HeapRetention(spec.heap_retain_bytes)  # before the model allocates anything
        self.sock = socket.socket(fileno=spec.fd)
        self.inbox = Inbox(self.sock)
        self.send_lock = threading.Lock()
        self.in_arenas = [Arena(name, 0, create=False) for name in spec.in_arenas]
        self.in_arena = self.in_arenas[0]
        # the frontend lends out an arena whose outputs it hands on, and names another for the next batch
        self.out_arenas = [Arena(name, 0, create=False) for name in spec.out_arenas]
        self.out_arena = self.out_arenas[0]
        self.backend: Backend | None = None
        self.states: SequenceStates | None = None  # a model with implicit sequence state: what it keeps
        self.client_regions = ClientRegions()
        self.cuda_regions = CudaRegions(spec.device_id, spec.kind, spec.instance_name)
        # messages a model queued to go before the worker's next one (custom metrics it released)
        self.metric_outbox: deque = deque()

    def send(self, kind: bytes, header, frames=()) -> None:
        with self.send_lock:  # models may send responses from threads of their own
            while self.metric_outbox:  # custom metrics the model released since the last message
                op, family, labels = self.metric_outbox.popleft()
                transport.send_message(self.sock, transport.METRIC,
                                       transport.encode(transport.MetricUpdate(op, family, labels)))
            transport.send_message(self.sock, kind, transport.encode(header), frames)

    def ask(self, header: transport.BlsRequest, frames: list) -> tuple[transport.BlsResult, list]:
        """Send a model's own request to the frontend and wait for its one answer."""
        number, answers = self.inbox.open_call()
        try:
            header.call = number
            self.send(transport.BLS, header, frames)
            answer = self.inbox.answer(answers)
        finally:
            self.inbox.close_call(number)
        if answer is None:
            raise SystemExit(0)  # the frontend has gone
        return answer

    def stream_sender(self, batch_id: int, index: int):
        """The send function behind one request's response sender: a STREAM message per response, which
        the frontend matches to the request by (batch, index)."""

        def send(response: WorkResponse | None, final: bool) -> None:
            frames: list = []
            if response is None:
                header = transport.StreamResponse(batch_id, index, final=final, empty=True)
            else:
                try:
                    refs = [self.encode_tensor(t, frames, inline=True) for t in response.outputs]
                    header = transport.StreamResponse(batch_id, index, refs, response.error, response.error_status,
                                                      final, parameters=response.parameters)
                except (ValueError, TypeError, KeyError) as e:
                    frames = []
                    header = transport.StreamResponse(batch_id, index, error=f"cannot return the model's output: {e}",
                                                      final=final)
            if final:
                self.inbox.forget(batch_id, index)
            self.send(transport.STREAM, header, frames)

        return send

    def start(self) -> bool:
        try:
            config = json.loads(self.spec.config_json)
            self.backend = load_backend(self.spec, config, self)
            if config.get("sequence_batching", {}).get("state"):
                self.states = SequenceStates(config, self.spec.model_dir)
            inputs, outputs = self.backend.metadata()
            detail = self.backend.detail
        except BackendError as e:
            self.send(transport.LOAD_FAILED, transport.LoadFailed(os.getpid(), str(e)))
            return False
        except Exception as e:
            detail = traceback.format_exc(limit=-3)
            self.send(transport.LOAD_FAILED, transport.LoadFailed(os.getpid(), f"{e}\n{detail}"))
            return False
        _settle_collector()
        checks = self.backend.checks_readiness
        self.send(transport.READY, transport.Ready(transport.PROTOCOL_VERSION, os.getpid(), inputs, outputs,
                                                   detail, checks))
        if checks:
            threading.Thread(target=self._answer_readiness, name="readiness", daemon=True).start()
        return True

    def _answer_readiness(self) -> None:
        """Answer the frontend's readiness checks with the model's own, while batches execute. Waiting
        for the next check, this thread reads the socket whenever the main loop does not."""
        assert self.backend is not None, "started once the backend has loaded"
        while (message := self.inbox.next_check()) is not None:
            check = transport.decode(transport.ReadinessCheck, message[1])
            try:
                answer = transport.ReadinessResult(check.number, ready=self.backend.is_ready())
            except BackendError as e:
                answer = transport.ReadinessResult(check.number, error=str(e))
            except Exception as e:  # the model's own failure: not ready, and why
                answer = transport.ReadinessResult(check.number, error=f"{type(e).__name__}: {e}")
            try:
                self.send(transport.READINESS_RESULT, answer)
            except OSError:
                return  # the frontend has gone

    def decode_tensor(self, ref: transport.TensorRef, frames) -> WorkTensor:
        buf: bytes | bytearray | memoryview
        if ref.cuda_handle:
            buf = self.cuda_regions.read(ref.cuda_handle, ref.shm_id, ref.cuda_device, ref.offset, ref.nbytes)
        elif ref.shm_key:
            buf = self.client_regions.view(ref.shm_key, ref.shm_id, ref.offset + ref.nbytes)[
                ref.offset:ref.offset + ref.nbytes]
        elif ref.frame >= 0:
            buf = frames[ref.frame]
        else:
            buf = self.in_arena.view[ref.offset:ref.offset + ref.nbytes]
        if ref.datatype == "BYTES":
            array = datatypes.deserialize_bytes(buf).reshape(ref.shape)
        else:
            # the frontend checked the size: the buffer holds exactly the shape's elements
            array = np.ndarray(ref.shape, datatypes.NUMPY_OF[ref.datatype], buf)
        return WorkTensor(ref.name, ref.datatype, array)

    def encode_tensor(self, t: WorkTensor, frames: list, shm_dest: transport.TensorRef | None = None,
                      inline: bool = False) -> transport.TensorRef:
        array = np.asarray(t.array)
        buf = datatypes.to_buffer(t.datatype, array)
        nbytes = len(buf) if isinstance(buf, bytes) else buf.nbytes
        ref = transport.TensorRef(t.name, t.datatype, list(array.shape), nbytes=nbytes)
        if t.arena_offset >= 0 and shm_dest is None:
            ref.offset = t.arena_offset  # the backend wrote it there
            return ref
        if shm_dest is not None:
            if nbytes > shm_dest.nbytes:
                raise OutputError(f"shared memory size specified with the request for output '{t.name}' "
                                  f"({shm_dest.nbytes} bytes) should be at least {nbytes} bytes to hold the results")
            if t.in_place:
                pass  # the backend wrote it there
            elif shm_dest.cuda_handle:
                self.cuda_regions.write(shm_dest.cuda_handle, shm_dest.shm_id, shm_dest.cuda_device,
                                        shm_dest.offset, buf)
            elif nbytes:
                view = self.client_regions.view(shm_dest.shm_key, shm_dest.shm_id, shm_dest.offset + nbytes)
                view[shm_dest.offset:shm_dest.offset + nbytes] = memoryview(buf).cast("B")
            ref.shm_key, ref.shm_id, ref.offset = shm_dest.shm_key, shm_dest.shm_id, shm_dest.offset
            ref.cuda_handle, ref.cuda_device = shm_dest.cuda_handle, shm_dest.cuda_device
            return ref
        if nbytes >= transport.INLINE_LIMIT and not inline:
            offset = self.out_arena.alloc(nbytes)
            if offset is not None:
                self.out_arena.write(buf, offset)
                ref.offset = offset
                return ref
        ref.frame = len(frames)
        frames.append(buf)
        return ref

    def use_out_arena(self, index: int) -> None:
        """The batch's output arena, as the frontend chose it."""
        arena = self.out_arenas[index]
        if arena is not self.out_arena:
            self.out_arena = arena
            if self.backend is not None:
                self.backend.output_arena(arena)

    def arena_alloc(self, nbytes: int) -> tuple[memoryview, int] | None:
        """Room for an output the backend writes into the batch's output arena itself."""
        if nbytes < transport.INLINE_LIMIT:
            return None
        offset = self.out_arena.alloc(nbytes)
        return None if offset is None else (self.out_arena.view[offset:offset + nbytes], offset)

    def run_batch(self, header: transport.Execute, frames) -> None:
        t0 = time.perf_counter_ns()
        self.use_out_arena(header.out_arena)
        self.in_arena = self.in_arenas[header.in_arena]
        decode = self.decode_tensor
        try:
            requests = [
                WorkRequest(r.id, [decode(ref, frames) for ref in r.inputs], r.outputs, r.parameters, r.batch_sizes,
                            trace=r.trace)
                for r in header.requests
            ]
        except (ValueError, TypeError) as e:  # a client region that cannot be mapped, malformed BYTES, too short
            self.send(transport.RESULT, transport.Result(header.batch_id, [], error=str(e)))
            return
        backend = self.backend
        assert backend is not None, "batches come only after the model loaded"
        states = self.states
        if states is not None:
            states.release(header.released)
            for request, r in zip(requests, header.requests):
                states.prepare(request, r.sequence)
        on_device = backend.writes_device_outputs
        try:
            for request, r in zip(requests, header.requests):
                for dest in r.shm_outputs:
                    if dest.shm_key:
                        view = self.client_regions.view(dest.shm_key, dest.shm_id, dest.offset + dest.nbytes)
                        request.output_buffers[dest.name] = view[dest.offset:dest.offset + dest.nbytes]
                    elif dest.cuda_handle and on_device:
                        ptr = self.cuda_regions.device_pointer(dest.cuda_handle, dest.shm_id, dest.cuda_device,
                                                               dest.offset)
                        request.device_outputs[dest.name] = (ptr, dest.nbytes)
        except ValueError as e:  # a client region that cannot be mapped or opened
            self.send(transport.RESULT, transport.Result(header.batch_id, [], error=str(e)))
            return
        uses_senders = backend.uses_senders
        not_run: list[int] = []
        if uses_senders:
            flags = self.inbox.cancel_flags_for(header.batch_id, len(requests))
            for index, request in enumerate(requests):
                request.sender = self.stream_sender(header.batch_id, index)
                request.cancelled = flags[index]
            if header.cancels:  # a batch sent ahead: a request cancelled while it waited never runs
                self.inbox.poll()
                not_run = [index for index, flag in enumerate(flags) if flag.cancelled]
        self.out_arena.reset()
        if backend.writes_arena_outputs:
            for request in requests:
                request.arena_alloc = self.arena_alloc
        run = [r for index, r in enumerate(requests) if index not in not_run] if not_run else requests
        t1 = time.perf_counter_ns()
        try:
            responses = backend.execute(run) if run else []
            batch_error = ""
        except BackendError as e:
            responses, batch_error = [], str(e)
        except Exception as e:
            responses, batch_error = [], f"{type(e).__name__}: {e}"
        t2 = time.perf_counter_ns()
        if not_run and not batch_error:  # in the batch's order again, an empty answer where a request was left out
            ran = iter(responses)  # (the python backend answers every request it ran, or raises)
            responses = [WorkResponse() if index in not_run else next(ran) for index in range(len(requests))]
        out_frames: list = []
        headers = []
        if uses_senders:  # requests that have ended: a late cancellation has nothing to reach
            self.inbox.forget_all(header.batch_id, [
                index for index in range(len(requests))
                if batch_error or index in not_run or (index < len(responses) and (not responses[index].deferred
                                                                                   or responses[index].rescheduled))])
        encode = self.encode_tensor
        for sent, answer in zip(header.requests, responses):
            if states is not None:
                states.keep(answer, sent.sequence, sent.outputs)
            dests = {d.name: d for d in sent.shm_outputs} if sent.shm_outputs else None
            try:
                refs = [encode(t, out_frames, dests.get(t.name) if dests else None) for t in answer.outputs]
                headers.append(transport.ResponseHeader(outputs=refs, error=answer.error,
                                                        error_status=answer.error_status,
                                                        parameters=answer.parameters, deferred=answer.deferred,
                                                        rescheduled=answer.rescheduled))
            except OutputError as e:
                headers.append(transport.ResponseHeader(error=str(e)))
            except (ValueError, TypeError, KeyError) as e:
                headers.append(transport.ResponseHeader(error=f"cannot return the model's output: {e}"))
        t3 = time.perf_counter_ns()
        result = transport.Result(header.batch_id, headers, t1 - t0, t2 - t1, t3 - t2, batch_error, not_run)
        self.send(transport.RESULT, result, out_frames)

    def serve(self) -> None:
        while True:
            message = self.inbox.next()
            if message is None:
                break  # the frontend has gone
            kind, header, frames = message
            if kind == transport.EXECUTE:
                self.heap.used()
                self.run_batch(transport.decode(transport.Execute, header), frames)
                self.heap.used()
            elif kind == transport.STOP:
                break

    def close(self) -> None:
        if self.backend is not None:
            try:
                self.backend.finalize()
            except Exception:
                traceback.print_exc()
        self.sock.close()


def _settle_collector() -> None:
    """Once the model is loaded: what loading made (the framework's modules, the model's own
    objects) lives as long as the worker, so it is taken out of the collector's sight. A full
    collection then walks only what serving has made since. With torch and onnxruntime imported
    (170,000 objects the collector tracks), a full collection paused the worker for 107 ms, and
    every request of its batch with it; frozen, for microseconds."""
    gc.collect()
    gc.freeze()


def run_worker(fd: int, parent_pid: int) -> int:
    """Be the worker that the spec on socket `fd` describes until told to stop; die with
    `parent_pid` (the frontend that exec'd us, or the template that forked us)."""
    die_with_parent(parent_pid)
    sock = socket.socket(fileno=fd)
    spec = transport.read_spec(sock)
    if spec is None:
        return 0  # the frontend has gone before saying what to be
    sock.detach()  # the Worker's own socket object takes the descriptor
    spec.fd = fd
    host_policy.apply(Placement(tuple(spec.cpu_cores), spec.numa_node))  # before any thread starts
    set_process_name(spec.instance_name)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the frontend decides when we stop
    worker = Worker(spec)
    try:
        if worker.start():
            worker.serve()
    finally:
        worker.close()
    return 0


def main() -> int:
    fd, parent_pid = os.environ.pop(transport.SOCKET_ENV).split()
    return run_worker(int(fd), int(parent_pid))


if __name__ == "__main__":
    sys.exit(main())
