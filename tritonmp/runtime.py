"""The server's runtime, whatever serves it: the model manager and the server API, built from the
server's settings, loaded, polled and stopped in one way for the `tritonmp` command
(tritonmp/command.py) and for the in-process API (tritonmp/tritonserver)."""

from __future__ import annotations

from .frontends import json_offload
from .ipc import arena
from .lifecycle.model_manager import ModelManager
from .logs import get_logger
from .observability.log_settings import LogSettings
from .observability.tracing import Tracer
from .scheduling.response_cache import ResponseCache
from .server_api import ServerApi
from .settings import ServerSettings

log = get_logger("server")


class ServerRuntime:
    def __init__(self, settings: ServerSettings, *, log_settings: LogSettings | None = None,
                 tracer: Tracer | None = None, cache: ResponseCache | None = None):
        self.settings = settings
        self._services = (log_settings, tracer, cache)
        self._models: ModelManager | None = None
        self._api: ServerApi | None = None
        self.fingerprints: dict = {}  # the repositories as the last poll saw them

    @property
    def built(self) -> bool:
        return self._api is not None

    @property
    def models(self) -> ModelManager:
        if self._models is None:
            raise RuntimeError("the server runtime is not built yet")
        return self._models

    @property
    def api(self) -> ServerApi:
        if self._api is None:
            raise RuntimeError("the server runtime is not built yet")
        return self._api

    async def build(self) -> None:
        """The model manager and the server API (on the loop that will serve them), after removing the
        shared memory a server that died left behind."""
        removed = arena.remove_orphans()
        if removed:
            log.warning("removed %d shared-memory segments left by a server that is gone", len(removed))
        self._models = ModelManager(self.settings)
        self._api = ServerApi(self._models, *self._services).serve_models()

    async def load_startup(self, names: list[str] | None, mark_loaded: bool = True) -> list[str]:
        """Load every model of the repositories (or the named ones); the failures, one line each.
        `mark_loaded`: the server is ready once this returns (else its caller says when: the command,
        once its listeners have settled what depends on the models loaded)."""
        await self.models.load_all(names)
        self.fingerprints = await self.models.repositories.fingerprints()
        if mark_loaded:
            self.api.loaded = True
        return self.models.failures()

    async def poll(self) -> None:
        """Load, reload and unload what changed in the repositories since the last look."""
        self.fingerprints = await self.models.poll_once(self.fingerprints)

    async def shutdown(self, deadline: float) -> None:
        """Stop taking requests and stop the models by `deadline` (their shared memory goes too)."""
        self.api.accepting = False
        await self.models.stop(deadline)
        json_offload.shutdown()
