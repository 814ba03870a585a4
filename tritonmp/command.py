"""The `tritonmp` command's lifecycle: the server's runtime (runtime.py) and its listeners
(frontends/listeners.py: HTTP, gRPC, metrics) on the main loop; stop in order on a signal (stop
accepting, drain in-flight requests, stop workers, unlink shared memory)."""

from __future__ import annotations

import asyncio
import gc
import signal
import time
from typing import Any

from .frontends.listeners import Listener
from .lifecycle.model_manager import ModelManager
from .logs import get_logger
from .observability.log_settings import LogSettings
from .observability.sd_notify import Notifier
from .observability.tracing import Tracer
from .runtime import ServerRuntime
from .scheduling.response_cache import ResponseCache
from .server_api import ServerApi
from .settings import ServerSettings

log = get_logger("server")


def _model_table(models: ModelManager) -> str:
    rows = []
    for name in sorted(models.models):
        entry = models.models[name]
        if entry.problem:
            rows.append((name, "-", "UNAVAILABLE: " + entry.problem.splitlines()[0]))
        for v, mv in sorted(entry.versions.items()):
            reason = mv.reason.splitlines()[0] if mv.reason else ""
            status = mv.state if mv.state == "READY" else f"{mv.state}: {reason}"
            rows.append((name, str(v), status))
    header = ("Model", "Version", "Status")
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(3)]
    line = "+" + "+".join("-" * (w + 2) for w in widths) + "+"

    def fmt(r):
        return "|" + "|".join(f" {c:<{w}} " for c, w in zip(r, widths)) + "|"

    return "\n".join([line, fmt(header), line, *(fmt(r) for r in rows), line])


def _settle_collector() -> None:
    """Once the start-up models are loaded: what start-up made (modules, protobuf descriptors, model
    configs, about 50,000 objects the collector tracks) lives as long as the process, so it is taken
    out of the collector's sight. A full collection then walks only what serving has made since:
    on add_py under perf_analyzer gRPC -c64, timed with gc.callbacks, a full collection paused the
    loop, and every request in flight, for 24-34 ms before and 1-1.3 ms after."""
    gc.collect()
    gc.freeze()


class Command:
    def __init__(self, settings: ServerSettings, listeners: list[Listener], log_settings: LogSettings | None = None,
                 tracer: Tracer | None = None, cache: ResponseCache | None = None):
        self.settings = settings
        self.listeners = listeners  # turned-off ones are not listed
        self.log_settings = log_settings or LogSettings()
        self.tracer = tracer or Tracer()
        self.cache = cache
        self.stop_requested = asyncio.Event()
        self.force_stop = asyncio.Event()
        self.signals = 0
        self.notifier = Notifier()
        self.serving: list[Listener] = []  # the listeners started

    def _on_signal(self, signum: int) -> None:
        self.signals += 1
        if self.signals > 1:
            log.warning("received %s again: stopping now", signal.Signals(signum).name)
            self.force_stop.set()
            return
        log.info("received %s, shutting down: finishing requests in flight for up to %.0fs",
                 signal.Signals(signum).name, self.settings.exit_timeout)
        self.stop_requested.set()

    async def _start_listeners(self, api: ServerApi) -> None:
        for listener in self.listeners:
            await listener.serve(api)
            self.serving.append(listener)
            log.info("Started %s at %s:%d", listener.name, listener.settings.address, listener.settings.port)

    async def _drain_listeners(self, deadline: float) -> bool:
        """Stop accepting and let requests in flight finish until the deadline; False when a second
        signal cut that short."""
        draining = asyncio.gather(*(listener.drain(deadline) for listener in self.serving), return_exceptions=True)
        forced = asyncio.get_running_loop().create_task(self.force_stop.wait())
        either: list[asyncio.Future[Any]] = [draining, forced]
        await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
        if self.force_stop.is_set():
            for listener in self.serving:
                await listener.force()
            await draining
        forced.cancel()
        return not self.force_stop.is_set()

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._on_signal, sig)
        watchdog = loop.create_task(self.notifier.watchdog())
        settings = self.settings
        runtime = ServerRuntime(settings, log_settings=self.log_settings, tracer=self.tracer, cache=self.cache)
        await runtime.build()
        models, api = runtime.models, runtime.api
        assert models is not None and api is not None, "built just above"
        poller = None
        code = 0
        try:
            try:
                await self._start_listeners(api)
            except OSError as e:  # a port in use, an address not on this host, unreadable TLS files
                log.error("cannot serve: %s", e)
                return 1
            names = settings.load_models if settings.model_control == "explicit" else None
            load = loop.create_task(runtime.load_startup(names, mark_loaded=False))
            stop = loop.create_task(self.stop_requested.wait())
            await asyncio.wait({load, stop}, return_when=asyncio.FIRST_COMPLETED)
            if load.done():
                failures = load.result()
                log.info("\n%s", _model_table(models))
                try:
                    for listener in self.serving:
                        listener.loaded(api)
                except ValueError as e:  # a listener that cannot serve the models loaded as told
                    log.error("%s", e)
                    return 1
                api.loaded = True  # ready: what the listeners serve by (Vertex AI's default model) is settled
                _settle_collector()
                self.notifier.notify("READY=1", "STATUS=serving" + (f"; {len(failures)} model version(s) "
                                                                    "unavailable" if failures else ""))
                if failures and settings.exit_on_error:
                    log.error("failed to load all models:\n  %s", "\n  ".join(failures))
                    code = 1
                    self.stop_requested.set()
                elif settings.model_control == "poll":
                    poller = loop.create_task(models.poll(settings.poll_secs, runtime.fingerprints))
                await stop
            else:
                load.cancel()
        finally:
            api.accepting = False  # readiness drops at once, while the frontends drain
            self.notifier.notify("STOPPING=1", "STATUS=finishing requests in flight")
            if poller is not None:
                poller.cancel()
            deadline = time.monotonic() + settings.exit_timeout
            if not await self._drain_listeners(deadline):
                deadline = time.monotonic()  # a second signal: stop workers now, still cleaning up
            await runtime.shutdown(deadline)
            await asyncio.to_thread(self.tracer.close)  # the spans still queued are exported
            watchdog.cancel()
            self.notifier.close()
            log.info("server stopped")
        return code
