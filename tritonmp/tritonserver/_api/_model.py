"""`Model` of the in-process API: inference, metadata, config, statistics, properties."""

from __future__ import annotations

import asyncio
import enum
from typing import Any

from ...errors import ServerError
from ._errors import InvalidArgumentError, from_server_error
from ._handle import ServerHandle
from ._request import InferenceRequest
from ._response import AsyncResponseIterator, ResponseIterator


class ModelBatchFlag(enum.IntEnum):
    UNKNOWN = 1
    FIRST_DIM = 2


class ModelTxnPropertyFlag(enum.IntEnum):
    ONE_TO_ONE = 1
    DECOUPLED = 2


class Model:
    """A model (a version, or -1 for the highest ready one) of a started server."""

    def __init__(self, server: ServerHandle, name: str, version: int = -1, state: str | None = None,
                 reason: str | None = None):
        if server._engine is None:
            raise InvalidArgumentError("Server not started")
        self._server = server
        self.name = name
        self.version = version
        self.state = state
        self.reason = reason

    def create_request(self, **kwargs) -> InferenceRequest:
        kwargs.pop("model", None)
        return InferenceRequest(model=self, **kwargs)

    def infer(self, inference_request: InferenceRequest | None = None, raise_on_error: bool = True,
              **kwargs) -> ResponseIterator:
        """Send a request; iterate over its responses as they come (one, or any number from a
        decoupled model), the last with `final` set."""
        request = inference_request if inference_request is not None else self.create_request(**kwargs)
        self._server._check_started()
        user_queue = request.response_queue
        if isinstance(user_queue, asyncio.Queue):
            raise InvalidArgumentError("infer() takes a queue.SimpleQueue or queue.Queue; an asyncio.Queue belongs "
                                       "to async_infer()")
        return ResponseIterator(self, request, raise_on_error, user_queue)

    def async_infer(self, inference_request: InferenceRequest | None = None, raise_on_error: bool = True,
                    **kwargs) -> AsyncResponseIterator:
        """As infer(), for asyncio: `async for response in model.async_infer(...)`."""
        request = inference_request if inference_request is not None else self.create_request(**kwargs)
        self._server._check_started()
        user_queue = request.response_queue
        if user_queue is not None and not isinstance(user_queue, asyncio.Queue):
            raise InvalidArgumentError("async_infer() takes an asyncio.Queue as its response queue")
        return AsyncResponseIterator(self, request, raise_on_error, user_queue)

    def _version(self) -> str:
        return "" if self.version in (-1, None) else str(self.version)

    def _ask(self, fn, *args):
        engine = self._server._check_started()
        try:
            return engine.run(fn, *args)
        except ServerError as e:
            raise from_server_error(e) from None

    def metadata(self) -> dict[str, Any]:
        return self._server._await(self._server._check_started().api.model_metadata, self.name, self._version())

    def ready(self) -> bool:
        return self._server._await(self._server._check_started().api.model_ready, self.name, self._version())

    def config(self, config_version: int = 1) -> dict[str, Any]:
        if config_version != 1:
            raise InvalidArgumentError(f"model configuration version {config_version} is not supported; use 1")
        return self._server._await(self._server._check_started().api.model_config, self.name, self._version())

    def statistics(self) -> dict[str, Any]:
        return self._ask(self._server._check_started().api.statistics, self.name, self._version())

    def batch_properties(self) -> ModelBatchFlag:
        config = self.config()
        return ModelBatchFlag.FIRST_DIM if config.get("max_batch_size", 0) > 0 else ModelBatchFlag.UNKNOWN

    def transaction_properties(self) -> ModelTxnPropertyFlag:
        decoupled = self.config().get("model_transaction_policy", {}).get("decoupled", False)
        return ModelTxnPropertyFlag.DECOUPLED if decoupled else ModelTxnPropertyFlag.ONE_TO_ONE

    def __repr__(self) -> str:
        return repr({"name": self.name, "version": self.version, "state": self.state})

    __str__ = __repr__
