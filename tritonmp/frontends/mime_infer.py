"""An infer request as SageMaker's and Vertex AI's endpoints take it: the JSON header's length of a
body with binary tensors comes in the Content-Type (`<mime>;json-header-size=N`) rather than in
Inference-Header-Content-Length, and the body is never compressed. Answered by the HTTP frontend's
infer handler; Triton's words for a Content-Type it cannot read."""

from __future__ import annotations

import re

import orjson

from .http_server import HttpApp, _send

_TEXT = [(b"content-type", b"text/plain")]


async def mime_infer(http: HttpApp, scope, receive, send, model: str, version: str, mime: str,
                     answer_in_content_type: bool) -> None:
    """Infer with `model`; `mime` ends in 'json-header-size='. `answer_in_content_type`: a binary answer
    tells its JSON header's length the same way (SageMaker), else in Inference-Header-Content-Length."""
    headers = []
    for key, value in scope["headers"]:
        if key == b"content-type":
            text = value.decode("latin-1")
            at = text.find(mime)
            if at > 0:
                await _send(send, 400, _error(f"expect MIME type for binary data starts with '{mime}', got: {text}"),
                            _TEXT)
                return
            if at == 0:
                length, size = _leading_int(text[len(mime):]), _content_length(scope)
                if length is None or not 0 <= length <= size:
                    await _send(send, 400, _error(f"inference header size should be in range (0, {size}), got: "
                                                  f"{text[len(mime):]}"), _TEXT)
                    return
                headers.append((b"inference-header-content-length", str(length).encode()))
        elif key not in (b"content-encoding", b"accept-encoding", b"inference-header-content-length"):
            headers.append((key, value))
    inner = dict(scope, headers=headers)
    await http.infer(inner, receive, _content_type_tells(send, mime) if answer_in_content_type else send,
                     model, version)


def _error(message: str) -> bytes:
    return orjson.dumps({"error": message})


def _leading_int(text: str) -> int | None:
    m = re.match(r"\s*[+-]?\d+", text)
    return int(m.group()) if m else None


def _content_length(scope) -> int:
    for key, value in scope["headers"]:
        if key == b"content-length" and value.isdigit():
            return int(value)
    return 0


def _content_type_tells(send, mime: str):
    """`send`, with a binary answer's Inference-Header-Content-Length told in its Content-Type instead."""

    async def sending(message) -> None:
        if message["type"] == "http.response.start":
            headers, length = [], None
            for key, value in message["headers"]:
                if key == b"inference-header-content-length":
                    length = value
                elif key != b"content-type":
                    headers.append((key, value))
            content_type = mime.encode() + length if length is not None else b"application/json"
            message = dict(message, headers=[(b"content-type", content_type), *headers])
        await send(message)

    return sending
