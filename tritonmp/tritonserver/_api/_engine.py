"""The in-process server's engine: the same model manager and server API the `tritonmp` command
serves over the network, on an asyncio loop in a thread of its own. Models still run in their
worker processes; the caller's thread only waits for answers."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable

from ...errors import ServerError, Status
from ...inference import InferRequest, InferResponse
from ...observability.log_settings import LogSettings
from ...observability.system import SystemSampler
from ...runtime import ServerRuntime
from ...scheduling.response_cache import ResponseCache
from ...settings import ServerSettings


class Engine(ServerRuntime):
    """The server's core on an event loop in a thread of its own, for callers in other threads."""

    def __init__(self, settings: ServerSettings, *, cache: ResponseCache | None, log_settings: LogSettings):
        super().__init__(settings, cache=cache, log_settings=log_settings)
        self.log_settings = log_settings  # closed when the server stops
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self._run_loop, name="tritonmp-engine", daemon=True)
        self.stopped = False
        self.sampler: SystemSampler | None = None  # the CPU/GPU figures of metrics(), made on first use

    def _run_loop(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def start(self) -> None:
        self.thread.start()
        self.call(self.build())

    def call(self, coro, timeout: float | None = None):
        """Run a coroutine on the engine's loop and wait for its result."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def run(self, fn: Callable, *args):
        """Run a plain function on the engine's loop (the core is not thread-safe) and wait."""
        async def wrapper():
            return fn(*args)

        return self.call(wrapper())

    def submit(self, request: InferRequest, deliver: Callable[[InferResponse | ServerError | None], None]
               ) -> Submission:
        """Start a request; `deliver` gets each response or error as it comes, then None (all on the
        engine's loop). Cancelling the returned Submission cancels the request (the model sees
        is_cancelled())."""
        submission = Submission(self.loop)

        async def run():
            try:
                if await self.api.resolve_decoupled(request.model_name, request.model_version):
                    async for item in self.api.infer_stream(request):
                        deliver(item)
                else:  # one response: no async generator to drive
                    deliver(await self.api.infer(request))
            except ServerError as e:  # the request failed as a whole: its one, final, answer
                e.final = True
                deliver(e)
            except asyncio.CancelledError:
                deliver(ServerError("Request for the model was cancelled", Status.CANCELLED))
                raise
            except Exception as e:  # a defect here still ends the request, with what went wrong
                error = ServerError(f"{type(e).__name__}: {e}", Status.INTERNAL)
                error.final = True
                deliver(error)
            finally:
                submission.finished = True
                deliver(None)

        def cancelled_before_running(_task=None):
            if not submission.finished:  # cancelled before its first step: run() never began
                submission.finished = True
                deliver(ServerError("Request for the model was cancelled", Status.CANCELLED))
                deliver(None)

        def start():
            if submission.cancelled:
                cancelled_before_running()
                return
            submission.task = self.loop.create_task(run())
            submission.task.add_done_callback(cancelled_before_running)

        self.loop.call_soon_threadsafe(start)
        return submission

    def stop(self, timeout: float) -> None:
        if self.stopped:
            return
        self.stopped = True
        try:
            if self.built:
                self.call(self.shutdown(time.monotonic() + timeout))
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(timeout + 5)
            if not self.thread.is_alive():
                self.loop.close()
            self.log_settings.close()  # its log file is closed: the server's records end with it


class Submission:
    """A request started on the engine's loop, as its caller holds it: cancel() from any thread."""

    __slots__ = ("loop", "task", "cancelled", "finished")

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop = loop
        self.task: asyncio.Task | None = None
        self.cancelled = False
        self.finished = False

    def done(self) -> bool:
        return self.finished

    def cancel(self) -> None:
        if self.cancelled or self.finished:
            return
        self.cancelled = True
        try:
            self.loop.call_soon_threadsafe(self._cancel)
        except RuntimeError:  # the engine's loop has closed: nothing runs any more
            pass

    def _cancel(self) -> None:  # on the loop
        if self.task is not None:
            self.task.cancel()
