"""A worker template: a process, started by the frontend with a clean exec, that imports once what
the workers of one backend need and then forks each of them, so that what it imported is shared
among them, page for page, until one of them writes to it.

What it imports is the worker runtime (numpy, msgspec, this package's worker modules) and, where
that pays off and is safe to fork, the framework (the backend's `preload`, in tritonmp.backends);
nothing it does touches CUDA, so a forked worker starts with no CUDA context and sets up its own GPU
as an exec'd one does. Before it forks it freezes its heap out of the garbage collector, whose
passes would otherwise write to every object they visit, and so copy the pages the workers share.

It speaks with the frontend over a SOCK_SEQPACKET socket (template_protocol.py; the frontend's
end is instances/templates.py):

- the frontend sends FORK (a `ForkRequest`: the worker's environment) with the worker's socket as
  an SCM_RIGHTS descriptor; the template forks, and answers FORKED (`Forked`: the worker's pid, or
  why it could not) with a pidfd of the worker, through which the frontend signals it;
- when a worker exits, the template reaps it and says EXITED (`Exited`: its wait status);
- when the socket closes, the template exits. Its workers die with it (PR_SET_PDEATHSIG), as the
  template dies with the frontend.
"""

from __future__ import annotations

import gc
import importlib
import os
import selectors
import signal
import socket
import sys
import traceback

import msgspec

from tritonmp import backends, testing
from tritonmp.ipc import template_protocol as wire
from tritonmp.ipc import transport

from .main import die_with_parent, run_worker, set_process_name

# backend -> the modules its template imports beyond the worker runtime. Only frameworks that
# import without starting threads or touching a GPU: TensorFlow starts threads at import and
# OpenVINO and TensorRT load their plugins at import, so their workers import them after the fork.


def _preload(backend: str) -> wire.Ready:
    preloaded, failed = [], []
    described = backends.get(backend)
    for module in ["numpy", *(described.preload if described is not None else ())]:
        try:
            importlib.import_module(module)
            preloaded.append(module)
        except Exception:  # noqa: BLE001 - an import that fails here is retried, and reported, by the worker
            failed.append(module)
    return wire.Ready(preloaded, failed)


class Template:
    def __init__(self, control: socket.socket):
        self.control = control
        self.wakeup = os.pipe()
        for end in self.wakeup:
            os.set_blocking(end, False)
        self.selector = selectors.DefaultSelector()
        self.selector.register(control, selectors.EVENT_READ)
        self.selector.register(self.wakeup[0], selectors.EVENT_READ)

    def serve(self) -> int:
        control = self.control
        signal.set_wakeup_fd(self.wakeup[1])
        signal.signal(signal.SIGCHLD, lambda *_: None)  # the wakeup fd says a worker exited
        while True:
            for key, _events in self.selector.select():
                if key.fileobj is control:
                    kind, body, fds = wire.receive(control)
                    if not kind:
                        return 0  # the frontend is done with us (or gone)
                    if kind == wire.FORK:
                        self.fork(body, fds)
                    else:
                        for fd in fds:
                            os.close(fd)
                else:
                    try:
                        os.read(self.wakeup[0], 4096)
                    except BlockingIOError:
                        pass
                    self.reap()

    def fork(self, body: bytes, fds: list[int]) -> None:
        control = self.control
        if len(fds) != 1:
            for fd in fds:
                os.close(fd)
            why = f"a fork request needs one socket, it came with {len(fds)}"
            wire.send(control, wire.FORKED, wire.Forked(error=why))
            return
        (fd,) = fds
        try:
            request = msgspec.msgpack.decode(body, type=wire.ForkRequest)
        except msgspec.DecodeError as e:
            os.close(fd)
            wire.send(control, wire.FORKED, wire.Forked(error=f"malformed fork request: {e}"))
            return
        template = os.getpid()
        try:
            pid = os.fork()
        except OSError as e:
            os.close(fd)
            wire.send(control, wire.FORKED, wire.Forked(error=f"cannot fork a worker: {e}"))
            return
        if pid == 0:
            code = 1
            try:
                code = self.become_worker(fd, request.env, template)
            except BaseException:  # noqa: BLE001 - whatever it was, the worker process ends here
                traceback.print_exc()
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        os.close(fd)
        try:  # before it can be reaped: the frontend signals this process, no other
            pidfd = os.pidfd_open(pid)
        except OSError:  # a kernel or sandbox without pidfds: the frontend signals it by its pid
            wire.send(control, wire.FORKED, wire.Forked(pid=pid))
            return
        try:
            wire.send(control, wire.FORKED, wire.Forked(pid=pid), [pidfd])
        finally:
            os.close(pidfd)

    def reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            wire.send(self.control, wire.EXITED, wire.Exited(pid, status))

    def become_worker(self, fd: int, env: dict[str, str], template: int) -> int:
        """In the forked child: the worker the environment describes, on socket `fd`."""
        self.selector.close()
        self.control.close()
        for end in self.wakeup:
            os.close(end)
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        os.environ.update(env)
        if "numpy.random" in sys.modules:  # a forked worker would otherwise draw what its siblings draw
            sys.modules["numpy.random"].seed()
        os.environ.pop(transport.SOCKET_ENV, None)  # the frontend's numbering, not ours
        return run_worker(fd, template)


def main() -> int:
    backend, frontend, control_fd = os.environ.pop(wire.TEMPLATE_ENV).split()
    die_with_parent(int(frontend))
    set_process_name(f"template:{backend}")
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the frontend decides when we stop
    control = socket.socket(fileno=int(control_fd))
    if testing.template_fails(backend):
        return 70
    ready = _preload(backend)
    gc.collect()
    gc.freeze()  # what the workers share stays out of the collector's passes, which would write to it
    template = Template(control)
    wire.send(control, wire.READY, ready)
    return template.serve()


if __name__ == "__main__":
    sys.exit(main())
