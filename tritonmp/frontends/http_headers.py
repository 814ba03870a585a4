"""The own headers of an HTTP response that many responses share (KeptHeaders), never changed, so
that the HTTP/1.1 protocol keeps the head it renders from each: a JSON answer's, a binary answer's for
each length of its JSON header, and an error's (text/plain for a request refused before its body)."""

from __future__ import annotations

from ..errors import ServerError


class KeptHeaders(list):
    """A response's own headers that many responses share, never changed: the protocol keeps the head
    it renders from them (with the server's default headers) for the next response that has them."""


JSON_HEADERS = KeptHeaders([(b"content-type", b"application/json")])  # a JSON response's own headers
TEXT_HEADERS = KeptHeaders([(b"content-type", b"text/plain")])  # what Triton answers before a request's body
_BINARY_HEADERS: dict[int, KeptHeaders] = {}  # JSON header length -> binary_headers' answer
_KEPT = 4096  # the binary answers' headers kept


def binary_headers(json_length: int) -> KeptHeaders:
    """The own headers of a response whose JSON header of `json_length` bytes binary tensors follow
    (a model's answers mostly have the same few lengths: the same list for each, its head kept)."""
    headers = _BINARY_HEADERS.get(json_length)
    if headers is None:
        if len(_BINARY_HEADERS) >= _KEPT:
            _BINARY_HEADERS.clear()
        headers = _BINARY_HEADERS[json_length] = KeptHeaders(
            [(b"content-type", b"application/octet-stream"), (b"inference-header-content-length", b"%d" % json_length)])
    return headers


class ModelRefused(ServerError):
    """A request refused for its model before its body is read (unknown, not ready, decoupled): Triton
    answers it with a Content-Type of text/plain, as it does before it reads a request's body."""


def error_headers(error: ServerError) -> KeptHeaders:
    """The own headers of an error's answer."""
    return TEXT_HEADERS if isinstance(error, ModelRefused) else JSON_HEADERS
