"""HTTP's infer endpoint, `POST /v2/models/{model}[/versions/{version}]/infer`: the one object both
of its paths answer through, the protocol's fast path (http_protocol.FastInfer, the common request
in hand without ASGI) and the ASGI route (http_server.HttpApp.infer, everything else). It states
what an HTTP infer is: the model checked before the body, the body decoded, forwarded headers added,
the request handed to the server API, the response encoded."""

from __future__ import annotations

import asyncio

from ..errors import ServerError
from ..inference import InferRequest, InferResponse
from ..server_api import ServerApi
from . import http_codec
from .http_headers import JSON_HEADERS, ModelRefused, binary_headers

ENDPOINT = "HTTP end point"  # as Triton names it in its refusal of a decoupled model


class InferEndpoint:
    __slots__ = ("api", "max_input_size")

    def __init__(self, api: ServerApi, max_input_size: int):
        self.api = api
        self.max_input_size = max_input_size  # a request body's bytes, as received and as inflated

    def model(self, name: str, version: str):
        """The model version a request is for, refused (as in Triton) before its body is read; None
        for a model that is not loaded yet but loads on demand (`loaded`)."""
        try:
            return self.api.model_for(name, version, ENDPOINT)
        except ServerError as e:
            raise ModelRefused(e.message, e.status) from None

    async def loaded(self, name: str, version: str):
        """The model version a request is for, loaded first where it loads on demand."""
        return await self.api.load_for(name, version, ENDPOINT)

    @staticmethod
    def headers(headers: list) -> tuple[int | None, str, str]:
        """An infer request's Inference-Header-Content-Length (None when absent), Content-Encoding and
        Accept-Encoding."""
        header_length = None
        content_encoding = accept_encoding = ""
        for key, value in headers:
            if key == b"inference-header-content-length":
                try:
                    header_length = int(value)
                except ValueError:
                    raise ServerError(f"Inference-Header-Content-Length '{value.decode(errors='replace')}' "
                                      "is not a number") from None
            elif key == b"content-encoding":
                content_encoding = value.decode("latin-1")
            elif key == b"accept-encoding":
                accept_encoding = value.decode("latin-1")
        return header_length, content_encoding, accept_encoding

    @staticmethod
    def decode(body, header_length: int | None, name: str, version: str, mv) -> tuple[InferRequest, bool]:
        """The request of an infer body in hand (JSON, JSON and binary tensors, or one raw binary
        input) for model version `mv`, and whether its outputs default to binary."""
        if header_length == 0:  # a raw binary request: no JSON header, the body is the one input
            return http_codec.decode_raw(body, name, version, mv.inputs, mv.max_batch_size), True
        return http_codec.decode_infer(body, header_length, name, version)

    def submit(self, request: InferRequest, forwarded: dict | None, mv=None) -> asyncio.Future:
        """Hand the request to the server API; its response comes as the future's result. `forwarded`:
        the headers --http-header-forward-pattern picked, added after the request's own parameters
        (as in Triton); `mv`: the version `model` gave in this same turn of the loop, else it is
        looked up again."""
        if forwarded:
            request.parameters.update(forwarded)
        return self.api.submit(request, ENDPOINT, mv)

    @staticmethod
    def encode(response: InferResponse, request: InferRequest, binary_default: bool,
               accept_encoding: str) -> tuple[list, bytes | list]:
        """The headers (less Content-Length) and the body, bytes or a list of parts, of an infer
        response."""
        out, json_length = http_codec.encode_infer(response, request, binary_default)
        # the very JSON_HEADERS list for a JSON body: the protocol keeps its heads by it
        headers: list = JSON_HEADERS if json_length is None else binary_headers(json_length)
        if accept_encoding:
            out, used = http_codec.compress(out if isinstance(out, bytes) else b"".join(out), accept_encoding)
            if used:
                headers = [*headers, (b"content-encoding", used.encode())]
        return headers, out
