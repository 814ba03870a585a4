"""What the in-process API's objects reach of each other: a model of its server (ServerHandle: the
engine, the shared arrays, the started check), and a request and its responses of their model
(ModelHandle). tritonserver.Server and tritonserver.Model implement them; the modules of requests,
responses and models depend on these protocols, not on each other."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from ._engine import Engine
from ._shared import SharedArrays


class ServerHandle(Protocol):
    """What a Model asks of its Server."""

    _engine: Engine | None
    _shared: SharedArrays

    def _check_started(self) -> Engine:
        """The started server's engine; InvalidArgumentError where it is not started."""

    def _await(self, coro_fn: Callable[..., Awaitable[Any]], *args: Any) -> Any:
        """`coro_fn(*args)` run on the engine's loop, waited for; a ServerError raised as Triton's."""


class ModelHandle(Protocol):
    """What a request and its responses ask of their Model."""

    name: str
    version: int

    @property
    def _server(self) -> ServerHandle: ...
