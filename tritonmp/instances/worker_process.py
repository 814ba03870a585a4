"""One model instance's worker process, incarnation after incarnation: started (forked from its
backend's template, or by exec where there is none) with its arenas and its end of a socketpair,
watched, restarted with backoff when it dies (restarts.py decides when, and when it is given up),
asked whether it is ready, and stopped.

A WorkerProcess is told once how to start (LaunchSpec, the same for every instance of a version, and
its InstanceSpec), and tells its owner (instance.Instance) what happens through WorkerEvents: the
worker's messages about its model, its warmup before it serves, its exit, its return after a
restart, a restart that failed, and giving up. It keeps its own counts (restarts, last exit)."""

from __future__ import annotations

import asyncio
import itertools
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Protocol

from .. import backends
from ..host_policy import Placement
from ..ipc import transport
from ..ipc.arena import Arena, segment_name
from ..ipc.channel import Channel
from ..ipc.output_arenas import OutputArenas
from ..logs import get_logger
from ..repository.python_envs import PythonEnv
from .rate_limiter import Demand
from .restarts import RestartPolicy, describe_exit
from .templates import WorkerTemplates

log = get_logger("pool")
_uids = itertools.count(1)
READINESS_TIMEOUT_S = 5.0  # how long a model's own readiness check may take, as in Triton's python backend
CONTROL = frozenset((transport.READY, transport.LOAD_FAILED, transport.READINESS_RESULT))  # the process's own


@dataclass(frozen=True)
class InstanceSpec:
    name: str  # Triton's instance name, e.g. add_0_0
    kind: str  # "CPU", "GPU" or "MODEL"
    device_id: int  # GPU index for KIND_GPU, 0 otherwise
    placement: Placement = Placement()  # its host policy's cores and NUMA node (tritonmp/host_policy.py)
    demand: Demand = Demand(0)  # what it asks of the rate limiter (its group's rate_limiter), where one runs


@dataclass(frozen=True)
class LaunchSpec:
    """How every worker of one model version is started."""

    model_name: str
    version: int
    model_dir: str
    backend: str
    config_json: str
    arena_bytes: int = 64 << 20
    log_verbose: int = 0
    gpus: tuple[int, ...] | None = None  # the server's GPUs, for KIND_MODEL instances
    load_timeout: float = 0.0  # seconds a worker may take to load before it is killed; 0: no limit
    heap_retain_bytes: int = 0  # memory a worker frees that it keeps for reuse (--worker-heap-retain-mb)
    templates: WorkerTemplates | None = None  # where workers are forked from (None: each is exec'd)
    code_file: str = ""  # a python-based backend's model.py ("": the version directory's model file)
    python_env: PythonEnv | None = None  # the model's own environment: its workers are exec'd in its interpreter


class LoadError(Exception):
    pass


class WorkerEvents(Protocol):
    """What a worker process tells the one who owns it."""

    def on_message(self, kind: bytes, header: memoryview, frames: list[memoryview]) -> None:
        """A message of the worker's other than READY, LOAD_FAILED and READINESS_RESULT."""

    async def warm_up(self) -> None:
        """The worker is READY: what must pass before it serves; LoadError fails the load."""

    def exited(self, pid: int, reason: str, serving: bool) -> None:
        """The worker `pid` has exited for `reason`; `serving`: it was (what it had is lost), else it
        was still loading."""

    def back(self) -> None:
        """A restarted worker is ready for work."""

    def restart_failed(self, error: LoadError) -> None:
        """A restart failed; another follows."""

    def given_up(self, why: str) -> None:
        """Restarts are given up: the instance stays down."""


class WorkerHandle(Protocol):
    """A worker process: exec'd (asyncio.subprocess.Process) or forked from a template
    (templates.ForkedProcess)."""

    @property
    def pid(self) -> int: ...

    @property
    def returncode(self) -> int | None: ...

    async def wait(self) -> int: ...

    def kill(self) -> None: ...

    def send_signal(self, sig: int) -> None: ...


class WorkerProcess:
    """The process side of a model instance: a slot that a worker process fills."""

    def __init__(self, launch: LaunchSpec, spec: InstanceSpec, events: WorkerEvents):
        self.launch = launch
        self.spec = spec
        self.events = events
        self.proc: WorkerHandle | None = None
        self.channel: Channel | None = None
        self.in_arenas: list[Arena] = []  # two: the batch in flight's, and the one sent ahead's
        self.outputs: OutputArenas | None = None
        self.ready: asyncio.Future | None = None
        self.alive = False
        self.started_at = 0.0
        self.restart_policy = RestartPolicy()
        self.restarts_total = 0  # restarts tried since it was loaded
        self.stopping = False
        self.last_exit = ""
        self.gave_up = False
        self.kill_reason = ""  # why we killed the worker, when we did
        self.checks_readiness = False  # the model has a readiness check of its own (Ready.checks_readiness)
        self._check: asyncio.Future[str] | None = None  # the readiness check in flight: why not ready, or ""
        self._checks = 0  # the number of the last readiness check asked
        self._watch: asyncio.Task | None = None

    # -- lifecycle -------------------------------------------------------------------------
    def _prepare(self) -> tuple[socket.socket, socket.socket, dict[str, str], transport.WorkerSpec]:
        """A new incarnation's arenas, its socketpair (ours, the worker's), its environment and its
        spec (sent as the first message on its socket)."""
        launch = self.launch
        uid = next(_uids)
        arena_bytes = launch.arena_bytes
        self.in_arenas = [Arena(segment_name(os.getpid(), f"{uid}-in{k or ''}"), arena_bytes, create=True)
                          for k in range(2)]
        self.outputs = OutputArenas(
            lambda k: Arena(segment_name(os.getpid(), f"{uid}-out{k or ''}"), arena_bytes, create=True))
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        spec = transport.WorkerSpec(
            fd=theirs.fileno(), parent_pid=os.getpid(),
            model_name=launch.model_name, model_version=launch.version, model_dir=launch.model_dir,
            backend=launch.backend, config_json=launch.config_json, instance_name=self.spec.name,
            kind=self.spec.kind, device_id=self.spec.device_id, in_arenas=[a.name for a in self.in_arenas],
            out_arenas=[a.name for a in self.outputs.all], arena_bytes=arena_bytes, log_verbose=launch.log_verbose,
            heap_retain_bytes=launch.heap_retain_bytes, cpu_cores=list(self.spec.placement.cores),
            numa_node=self.spec.placement.numa_node, code_file=launch.code_file)
        env = dict(os.environ)
        env[transport.SOCKET_ENV] = f"{theirs.fileno()} {os.getpid()}"
        if self.spec.kind == "GPU":
            env["CUDA_VISIBLE_DEVICES"] = str(self.spec.device_id)
        elif self.spec.kind == "CPU":
            env["CUDA_VISIBLE_DEVICES"] = ""
        elif launch.gpus is not None:  # KIND_MODEL: every GPU the server may use
            env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in launch.gpus)
        return ours, theirs, env, spec

    async def start(self) -> None:
        """Start a worker and wait for READY. Raises LoadError with the worker's reason."""
        launch = self.launch
        ours, theirs, env, spec = self._prepare()
        loop = asyncio.get_running_loop()
        self.ready = loop.create_future()
        try:
            self.proc = await self._spawn(env, theirs)
        except OSError as e:
            ours.close()
            self._release()
            raise LoadError(f"cannot start a worker process: {e}") from None
        finally:
            theirs.close()
        _, self.channel = await loop.connect_accepted_socket(
            lambda: Channel(self._on_message, self._on_channel_lost), ours)
        self.channel.send(transport.SPEC, transport.encode(spec))
        self._watch = loop.create_task(self._watch_exit(self.proc))
        try:
            ready = await asyncio.wait_for(asyncio.shield(self.ready), launch.load_timeout or None)
        except asyncio.TimeoutError:
            self.ready.cancel()
            self.kill_reason = "was killed while loading"
            self.proc.kill()
            self._release()
            raise LoadError(f"instance '{self.spec.name}' did not finish loading within {launch.load_timeout:g}s "
                            "(--model-load-timeout-secs)") from None
        except LoadError:
            self._release()
            raise
        # Both sides have mapped the arenas: drop their names so that nothing can be left behind.
        for arena in self.in_arenas:
            arena.unlink()
        self.wire()[1].unlink()
        try:
            await self.events.warm_up()
        except LoadError:
            self._release()
            raise
        self.alive = True
        self.started_at = time.monotonic()
        log.info("worker %s of model '%s' version %d is ready (pid %d)%s", self.spec.name,
                 launch.model_name, launch.version, self.proc.pid, f"; {ready.detail}" if ready.detail else "")

    async def _spawn(self, env: dict[str, str], theirs: socket.socket) -> WorkerHandle:
        """The worker process: forked from its backend's template where the server has templates
        (only what differs from the frontend's environment goes with the request), else exec'd; in
        the model's own environment's interpreter where it has one (templates are the server's)."""
        templates, python_env = self.launch.templates, self.launch.python_env
        if python_env is not None:
            return await asyncio.create_subprocess_exec(
                *python_env.argv("tritonmp.workers.main"), env=python_env.environ(env), stdin=subprocess.DEVNULL,
                pass_fds=(theirs.fileno(),))
        if templates is not None:
            own = {k: v for k, v in env.items() if os.environ.get(k) != v}
            try:
                return await templates.fork(self.launch.backend, own, theirs.fileno())
            except OSError as e:  # the template could not start or fork it: a worker of its own, then
                log.warning("worker %s of model '%s' is started by exec instead: %s", self.spec.name,
                            self.launch.model_name, e)
        return await asyncio.create_subprocess_exec(
            sys.executable, "-m", "tritonmp.workers.main", env=env, stdin=subprocess.DEVNULL,
            pass_fds=(theirs.fileno(),))

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

    async def _watch_exit(self, proc: WorkerHandle) -> None:
        code = await proc.wait()
        if proc is not self.proc:
            return
        was_alive, self.alive = self.alive, False
        reason = self.kill_reason or describe_exit(code)
        self.kill_reason = ""
        if self._check is not None and not self._check.done():
            self._check.set_result("Stub process is not healthy while waiting for user-defined is_ready() response")
        if self.ready is not None and not self.ready.done():
            # Triton's words for a model process that died while it loaded (its qa greps for them)
            self.ready.set_exception(LoadError(f"Stub process '{self.spec.name}' is not healthy. Its worker process "
                                               f"{reason} while loading"))
        if not was_alive:  # a failed load: start() cleans up and reports it
            self.events.exited(proc.pid, reason, False)
            return
        self._release()
        self.events.exited(proc.pid, reason, True)
        if self.stopping:
            return
        self.last_exit = reason
        log.error("worker %s of model '%s' version %d (pid %d) %s; restarting it", self.spec.name,
                  self.launch.model_name, self.launch.version, proc.pid, reason)
        asyncio.get_running_loop().create_task(self._restart())

    @property
    def restarts(self) -> int:
        """Restarts since its worker last lived long enough to count as stable."""
        return self.restart_policy.restarts

    def _give_up(self, reason: str) -> None:
        why = self.restart_policy.gave_up(self.spec.name, reason)
        log.error("model '%s' version %d: %s", self.launch.model_name, self.launch.version, why)
        self.gave_up = True
        self.events.given_up(why)

    async def _restart(self) -> None:
        policy = self.restart_policy
        if policy.died(time.monotonic(), self.started_at):
            self._give_up(self.last_exit)
            return
        while not self.stopping:
            delay = policy.next_delay()
            self.restarts_total += 1
            await asyncio.sleep(delay)
            if self.stopping:
                return
            try:
                await self.start()
            except LoadError as e:
                log.error("restarting worker %s of model '%s' failed: %s", self.spec.name,
                          self.launch.model_name, e)
                if policy.failed(time.monotonic()):
                    self._give_up(str(e).splitlines()[0] if str(e) else "load failed")
                    return
                self.events.restart_failed(e)
                continue
            self.events.back()
            return

    def wire(self) -> tuple[Channel, OutputArenas]:
        """The running worker's channel and output arenas (batches go only to a running worker)."""
        channel, outputs = self.channel, self.outputs
        assert channel is not None and outputs is not None, f"instance '{self.spec.name}' has no running worker"
        return channel, outputs

    def kill(self, reason: str) -> None:
        """Kill the worker; its exit is handled as a death for `reason`."""
        proc = self.proc
        if proc is not None and proc.returncode is None:
            self.kill_reason = reason
            proc.kill()

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

    # -- readiness and the worker's own word -----------------------------------------------
    async def readiness(self) -> str:
        """Why this instance is not ready, or "" when it is, as Triton's python backend says it: its
        worker must be running, and a model with a readiness check of its own (is_ready) must answer
        yes within READINESS_TIMEOUT_S. One check at a time: a caller that finds one in flight
        shares its answer. A check that takes too long goes on, and the next caller waits for it."""
        if not self.alive:
            if backends.BACKENDS[self.launch.backend].stub:  # Triton's words, which its qa greps the log for
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
            self.wire()[0].send(transport.READINESS, transport.encode(transport.ReadinessCheck(self._checks)), [])
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

    def _on_message(self, kind: bytes, header: memoryview, frames: list[memoryview]) -> None:
        """The process's own messages (READY, LOAD_FAILED, READINESS_RESULT) here; the others to its owner."""
        if kind not in CONTROL:
            self.events.on_message(kind, header, frames)
        elif kind == transport.READINESS_RESULT:
            self._on_readiness(transport.decode(transport.ReadinessResult, header))
        elif (loading := self.ready) is None or loading.done():
            return  # READY or LOAD_FAILED of a load that has ended
        elif kind == transport.READY:
            ready = transport.decode(transport.Ready, header)
            if ready.protocol != transport.PROTOCOL_VERSION:
                loading.set_exception(LoadError(f"worker speaks protocol {ready.protocol}, "
                                                f"expected {transport.PROTOCOL_VERSION}"))
            else:
                self.checks_readiness = ready.checks_readiness
                loading.set_result(ready)
        else:
            loading.set_exception(LoadError(transport.decode(transport.LoadFailed, header).error))
