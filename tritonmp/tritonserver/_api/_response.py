"""`InferenceResponse` and the iterators that hand a request's responses to the caller as they
come: `ResponseIterator` (threads) and `AsyncResponseIterator` (asyncio)."""

from __future__ import annotations

import asyncio
import queue
from dataclasses import dataclass, field

from ... import inference
from ...errors import ServerError
from ._errors import InternalError, TritonError, from_server_error
from ._handle import ModelHandle
from ._request import _api_tensor
from ._tensor import Tensor


@dataclass
class InferenceResponse:
    model: ModelHandle
    request_id: str | None = None
    parameters: dict[str, str | int | bool] = field(default_factory=dict)
    outputs: dict[str, Tensor] = field(default_factory=dict)
    error: TritonError | None = None
    classification_label: str | None = None
    final: bool = False


class _Responses:
    """Turns what the engine delivers (core responses, errors, then None) into InferenceResponses
    with Triton's final flags: the last response of a request is final; when a decoupled model
    ends its request after its last response, an empty final response follows."""

    def __init__(self, model: ModelHandle, request_id: str, gpu: int | None = None):
        self.model = model
        self.request_id = request_id
        self.gpu = gpu  # outputs are copied to this GPU
        self.sent_final = False

    def convert(self, item: inference.InferResponse | ServerError | None) -> InferenceResponse | None:
        if item is None:
            if self.sent_final:
                return None
            self.sent_final = True
            return InferenceResponse(self.model, self.request_id, final=True)
        if isinstance(item, ServerError):
            final = item.final  # the last response (a request that failed as a whole)
            self.sent_final = self.sent_final or final
            return InferenceResponse(self.model, self.request_id, error=from_server_error(item), final=final)
        final = bool(item.final)
        self.sent_final = self.sent_final or final
        try:
            outputs = {} if item.empty else {t.name: _api_tensor(t, self.gpu) for t in item.outputs}
        except (TritonError, ValueError) as exc:  # the copy to the GPU failed (out of memory, ...)
            error = exc if isinstance(exc, TritonError) else InternalError(str(exc))
            return InferenceResponse(self.model, item.id or self.request_id, error=error, final=final)
        return InferenceResponse(self.model, item.id or self.request_id, dict(item.parameters), outputs, final=final)


class _Iterator:
    """What both iterators share: the request started on the engine, responses converted as they
    come and handed to `_hand_over` (on the engine's loop), cancellation, and the raise_on_error
    rule applied to each response taken."""

    def __init__(self, model: ModelHandle, request, raise_on_error: bool, user_queue):
        self._user_queue = user_queue
        self._raise = raise_on_error
        self._complete = False
        self._convert = _Responses(model, request.request_id or "", request._output_device())
        self._submission = model._server._check_started().submit(request._core_request(), self._deliver)

    def _hand_over(self, response: InferenceResponse) -> None:
        """Give a converted response to the caller, as each kind of iterator does."""
        raise NotImplementedError

    def _deliver(self, item) -> None:  # on the engine's loop
        response = self._convert.convert(item)
        if response is not None:
            self._hand_over(response)

    def _took(self, response: InferenceResponse) -> InferenceResponse:
        self._complete = response.final
        if response.error is not None and self._raise:
            raise response.error
        return response

    def cancel(self) -> None:
        self._submission.cancel()

    def __del__(self):
        submission = getattr(self, "_submission", None)  # absent when __init__ raised
        if submission is not None and not getattr(self, "_complete", True) and not submission.done():
            submission.cancel()


class ResponseIterator(_Iterator):
    """A request's responses for a thread: iterate until the final one. Abandoning the iterator (or
    `cancel()`) cancels the request; the model sees is_cancelled()."""

    def __init__(self, model: ModelHandle, request, raise_on_error: bool, user_queue=None):
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        super().__init__(model, request, raise_on_error, user_queue)

    def _hand_over(self, response: InferenceResponse) -> None:
        self._queue.put(response)
        if self._user_queue is not None:
            self._user_queue.put(response)

    def __iter__(self) -> ResponseIterator:
        return self

    def __next__(self) -> InferenceResponse:
        if self._complete:
            raise StopIteration
        return self._took(self._queue.get())


class AsyncResponseIterator(_Iterator):
    """A request's responses for asyncio: `async for` until the final one; `cancel()` cancels it."""

    def __init__(self, model: ModelHandle, request, raise_on_error: bool, user_queue: asyncio.Queue | None = None):
        self._loop = asyncio.get_running_loop()
        self._queue: asyncio.Queue = asyncio.Queue()
        super().__init__(model, request, raise_on_error, user_queue)

    def _hand_over(self, response: InferenceResponse) -> None:  # to the caller's loop
        self._loop.call_soon_threadsafe(self._put, response)

    def _put(self, response: InferenceResponse) -> None:
        self._queue.put_nowait(response)
        if self._user_queue is not None:
            self._user_queue.put_nowait(response)

    def __aiter__(self) -> AsyncResponseIterator:
        return self

    async def __anext__(self) -> InferenceResponse:
        if self._complete:
            raise StopAsyncIteration
        return self._took(await self._queue.get())
