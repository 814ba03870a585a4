"""Worker templates, the frontend's side (the template process is workers/template.py): one per
backend, started when that backend's first worker is, which forks the backend's workers from
what it has imported; and `ForkedProcess`, the handle of a forked worker, with the part of
asyncio.subprocess.Process that WorkerProcess uses (pid, returncode, wait, kill, send_signal).

A forked worker is the template's child: the template reaps it and says how it exited, and the
frontend signals it through a pidfd, which names that process and no later one with its pid. A
template that dies takes its workers with it (they die with their parent); they are seen to exit
as killed, and restarted as any worker that died is, from a template started anew."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
from collections import deque

import msgspec

from ..ipc import template_protocol as wire
from ..logs import get_logger

log = get_logger("pool")
START_TIMEOUT_S = 120.0  # a template imports a framework: torch takes seconds on a slow disk


class ForkedProcess:
    """A worker forked by a template."""

    def __init__(self, pid: int, pidfd: int | None):
        self.pid = pid
        self.returncode: int | None = None
        self._pidfd = pidfd
        self._exited: asyncio.Future[int] = asyncio.get_running_loop().create_future()

    def exited(self, code: int) -> None:
        """Its exit, as subprocess says it: the exit status, or minus the signal that killed it."""
        if self.returncode is not None:
            return
        self.returncode = code
        if self._pidfd is not None:
            os.close(self._pidfd)
        self._exited.set_result(code)

    async def wait(self) -> int:
        return await asyncio.shield(self._exited)

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            try:
                if self._pidfd is not None:
                    signal.pidfd_send_signal(self._pidfd, sig)
                else:  # not reaped yet (the template says when it is): the pid is still this process's
                    os.kill(self.pid, sig)
            except ProcessLookupError:
                pass  # exited; the template's word of it is on its way

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class Template:
    """One template process and the workers it has forked."""

    def __init__(self, backend: str):
        self.backend = backend
        self.proc: asyncio.subprocess.Process | None = None
        self.sock: socket.socket | None = None
        self.children: dict[int, ForkedProcess] = {}
        self.forks: deque[asyncio.Future[ForkedProcess]] = deque()  # fork requests sent, in order
        # fork requests not sent yet: many workers starting at once fill the socket (each carries its spec)
        self.outbox: deque[tuple[bytes, int, asyncio.Future[ForkedProcess]]] = deque()
        self._writing = False  # waiting for room in the socket
        self.ready: asyncio.Future[wire.Ready] | None = None
        self.alive = False
        self.closing = False

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        env = dict(os.environ)
        env[wire.TEMPLATE_ENV] = f"{self.backend} {os.getpid()} {theirs.fileno()}"
        try:
            self.proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "tritonmp.workers.template", env=env, stdin=subprocess.DEVNULL,
                pass_fds=(theirs.fileno(),))
        except OSError:
            ours.close()
            raise
        finally:
            theirs.close()
        ours.setblocking(False)
        self.sock = ours
        self.ready = loop.create_future()
        self.alive = True
        loop.add_reader(ours.fileno(), self._on_readable)
        loop.create_task(self._watch(self.proc))
        try:
            ready = await asyncio.wait_for(asyncio.shield(self.ready), START_TIMEOUT_S)
        except (asyncio.TimeoutError, OSError):
            await self.close()
            raise OSError(f"the {self.backend} worker template did not start") from None
        log.info("worker template for the %s backend is ready (pid %d): %s imported%s", self.backend,
                 self.proc.pid, ", ".join(ready.preloaded),
                 f"; left to its workers: {', '.join(ready.failed)}" if ready.failed else "")

    async def fork(self, env: dict[str, str], fd: int) -> ForkedProcess:
        """A worker with these environment variables set, on socket `fd` (which stays ours to close)."""
        if not self.alive or self.sock is None:
            raise OSError(f"the {self.backend} worker template is not running")
        future: asyncio.Future[ForkedProcess] = asyncio.get_running_loop().create_future()
        self.outbox.append((wire.encode(wire.FORK, wire.ForkRequest(env)), fd, future))
        self._flush()
        return await future

    def _flush(self) -> None:
        """Send what the outbox holds, in order, as the socket has room for it."""
        sock, loop = self.sock, asyncio.get_running_loop()
        while sock is not None and self.outbox:
            packet, fd, future = self.outbox[0]
            try:
                wire.send_packet(sock, packet, [fd])
            except BlockingIOError:
                if not self._writing:
                    loop.add_writer(sock.fileno(), self._flush)
                    self._writing = True
                return
            except OSError as e:  # this request cannot go (EMSGSIZE: a spec larger than the socket takes)
                self.outbox.popleft()
                if not future.done():
                    future.set_exception(OSError(f"cannot send the fork request to the {self.backend} worker "
                                                 f"template: {e}"))
                continue
            self.outbox.popleft()
            self.forks.append(future)  # answered in the order sent
        if self._writing and sock is not None:
            loop.remove_writer(sock.fileno())
        self._writing = False

    def _on_readable(self) -> None:
        sock = self.sock
        while sock is not None:
            try:
                kind, body, fds = wire.receive(sock)
            except BlockingIOError:
                return
            except OSError:
                kind, body, fds = b"", b"", []
            if not kind:
                self._died()
                return
            try:
                self._on_message(kind, body, fds)
            except msgspec.DecodeError:
                log.error("the %s worker template sent a malformed message", self.backend)
                for fd in fds:
                    os.close(fd)

    def _on_message(self, kind: bytes, body: bytes, fds: list[int]) -> None:
        if kind == wire.READY:
            if self.ready is not None and not self.ready.done():
                self.ready.set_result(msgspec.msgpack.decode(body, type=wire.Ready))
        elif kind == wire.FORKED:
            forked = msgspec.msgpack.decode(body, type=wire.Forked)
            future = self.forks.popleft() if self.forks else None
            if forked.error:
                for fd in fds:
                    os.close(fd)
                if future is not None and not future.done():
                    future.set_exception(OSError(forked.error))
                return
            pidfd = fds[0] if fds else None  # none where the kernel has no pidfds
            for fd in fds[1:]:
                os.close(fd)
            if pidfd is not None:
                os.set_inheritable(pidfd, False)
            # known before anything else runs: the template's word of its exit may come next
            child = self.children[forked.pid] = ForkedProcess(forked.pid, pidfd)
            if future is not None and not future.done():
                future.set_result(child)
            else:  # its requester has gone: it is not wanted
                child.kill()
        elif kind == wire.EXITED:
            exited = msgspec.msgpack.decode(body, type=wire.Exited)
            gone = self.children.pop(exited.pid, None)
            if gone is not None:
                gone.exited(os.waitstatus_to_exitcode(exited.status))
        for fd in fds if kind != wire.FORKED else ():
            os.close(fd)

    async def _watch(self, proc: asyncio.subprocess.Process) -> None:
        await proc.wait()
        self._died()

    def _died(self) -> None:
        """The template is gone, and its workers with it (each dies with its parent)."""
        if not self.alive:
            return
        self.alive = False
        if not self.closing:
            log.error("the %s worker template (pid %d) exited; its workers die with it and are restarted from a "
                      "new one", self.backend, self.proc.pid if self.proc is not None else 0)
        loop = asyncio.get_running_loop()
        if self.sock is not None:
            loop.remove_reader(self.sock.fileno())
            if self._writing:
                loop.remove_writer(self.sock.fileno())
                self._writing = False
            self.sock.close()
            self.sock = None
        for _packet, _fd, future in self.outbox:
            if not future.done():
                future.set_exception(OSError(f"the {self.backend} worker template exited"))
        self.outbox.clear()
        if self.ready is not None and not self.ready.done():
            self.ready.set_exception(OSError(f"the {self.backend} worker template exited while starting"))
        while self.forks:
            future = self.forks.popleft()
            if not future.done():
                future.set_exception(OSError(f"the {self.backend} worker template exited"))
        for child in list(self.children.values()):
            child.kill()
            child.exited(-signal.SIGKILL)
        self.children.clear()

    async def close(self) -> None:
        """Stop the template (its workers are stopped first, by their pools)."""
        proc = self.proc
        self.closing = True
        self._died()
        if proc is None or proc.returncode is not None:
            return
        try:
            await asyncio.wait_for(proc.wait(), 5.0)  # it exits when its socket closes
        except asyncio.TimeoutError:
            proc.kill()
            await proc.wait()


class WorkerTemplates:
    """The server's templates, one per backend, each started when its backend's first worker is."""

    def __init__(self) -> None:
        self._templates: dict[str, Template] = {}
        self._starting: dict[str, asyncio.Task[Template]] = {}

    async def fork(self, backend: str, env: dict[str, str], fd: int) -> ForkedProcess:
        template = await self._template(backend)
        return await template.fork(env, fd)

    async def _template(self, backend: str) -> Template:
        template = self._templates.get(backend)
        if template is not None and template.alive:
            return template
        task = self._starting.get(backend)
        if task is None:
            task = self._starting[backend] = asyncio.get_running_loop().create_task(self._start(backend))
        try:
            return await asyncio.shield(task)
        finally:
            if task.done() and self._starting.get(backend) is task:
                del self._starting[backend]

    async def _start(self, backend: str) -> Template:
        template = Template(backend)
        await template.start()
        self._templates[backend] = template
        return template

    async def close(self) -> None:
        for task in self._starting.values():
            task.cancel()
        await asyncio.gather(*(t.close() for t in self._templates.values()), return_exceptions=True)
        self._templates.clear()
