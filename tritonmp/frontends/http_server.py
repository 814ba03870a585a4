"""The HTTP/REST frontend (KServe v2 with Triton's extensions) as one ASGI app for uvicorn.

Handlers only decode into the core's request type and encode its answers; the infer route is
dispatched by a precompiled pattern ahead of the router, the others by a small route table. The
infer route's common case does not reach this app: the protocol serves it (http_protocol.FastInfer)
through the same endpoint object (http_infer.InferEndpoint).
"""

from __future__ import annotations

import base64
import binascii
import re
import zlib

import orjson

from .. import __version__
from ..errors import ServerError, invalid, too_large, unsupported
from ..ipc.shm_registry import IPC_HANDLE_SIZE
from ..logs import get_logger
from ..observability import otel
from ..server_api import EXTENSIONS, ServerApi
from . import generate, http_codec, json_offload
from .http_headers import JSON_HEADERS, error_headers
from .http_infer import InferEndpoint
from .http_protocol import BODY_KEY, FORWARDED_KEY, ReceivedBody
from .inflate import TooLarge, inflate
from .request_params import unsigned, wrong_json_type
from .restricted import HTTP_GROUP, Restrictions, http_message

log = get_logger("http")

_TEXT = [(b"content-type", b"text/plain")]

_MODEL = r"/v2/models/(?P<model>[^/]+)(?:/versions/(?P<version>[0-9]+))?"  # Triton's: other versions are Not Found
INFER = re.compile(_MODEL + r"/infer")
ROUTES = [
    (re.compile(r"/v2/models/stats"), "GET", "all_stats"),  # before a model named "stats"
    (re.compile(r"/v2/health/live"), "GET", "live"),
    (re.compile(r"/v2/health/ready"), "GET", "ready"),
    (re.compile(r"/v2"), "GET", "server_metadata"),
    (re.compile(_MODEL), "GET", "model_metadata"),
    (re.compile(_MODEL + r"/ready"), "GET", "model_ready"),
    (re.compile(_MODEL + r"/config"), "GET", "model_config"),
    (re.compile(_MODEL + r"/stats"), "GET", "model_stats"),
    (re.compile(_MODEL + r"/generate"), "POST", "generate"),
    (re.compile(_MODEL + r"/generate_stream"), "POST", "generate_stream"),
    (re.compile(r"/v2/trace/setting"), "GET", "trace_get"),
    (re.compile(r"/v2/trace/setting"), "POST", "trace_update"),
    (re.compile(r"/v2/models/(?P<model>[^/]+)/trace/setting"), "GET", "trace_get"),
    (re.compile(r"/v2/models/(?P<model>[^/]+)/trace/setting"), "POST", "trace_update"),
    (re.compile(r"/v2/logging"), "GET", "logging_get"),
    (re.compile(r"/v2/logging"), "POST", "logging_update"),
    (re.compile(r"/v2/repository/index"), "POST", "repository_index"),
    (re.compile(r"/v2/repository/models/(?P<model>[^/]+)/load"), "POST", "repository_load"),
    (re.compile(r"/v2/repository/models/(?P<model>[^/]+)/unload"), "POST", "repository_unload"),
    (re.compile(r"/v2/(?P<kind>system|cuda)sharedmemory(?:/region/(?P<region>[^/]+))?/status"), "GET",
     "shm_status"),
    (re.compile(r"/v2/(?P<kind>system|cuda)sharedmemory/region/(?P<region>[^/]+)/register"), "POST",
     "shm_register"),
    (re.compile(r"/v2/(?P<kind>system|cuda)sharedmemory(?:/region/(?P<region>[^/]+))?/unregister"), "POST",
     "shm_unregister"),
]


async def _send(send, status: int, body: bytes | list, headers=JSON_HEADERS) -> None:
    """A response whose body is bytes, or a list of parts (bytes-like, of bytes) written in turn."""
    parts = body if isinstance(body, list) else (body,)
    await send({"type": "http.response.start", "status": status,
                "headers": [*headers, (b"content-length", str(sum(len(p) for p in parts)).encode())]})
    last = len(parts) - 1
    for i, part in enumerate(parts):
        await send({"type": "http.response.body", "body": part, "more_body": i < last})


async def _with_data(stream):
    """A response stream without the final flag's empty responses (server-sent events carry data)."""
    async for item in stream:
        if isinstance(item, ServerError) or not item.empty:
            yield item


def _whole_body(receive, received: ReceivedBody):
    """`receive` for a request whose body the protocol receives into one buffer: its own ASGI
    messages are empty and only say when the body is complete; then the one message is the whole
    body, as a view of that buffer."""

    async def whole():
        while True:
            message = await receive()
            if message["type"] != "http.request" or not message.get("more_body", False):
                break
        if message["type"] == "http.request":
            if not received.done:
                return {"type": "http.disconnect"}
            message = {"type": "http.request", "body": received.view, "more_body": False}
        return message

    return whole


def body_receive(scope, receive):
    """The request's `receive`: the whole body in one message where the protocol received it into one
    buffer (see `_whole_body`)."""
    received = scope.get(BODY_KEY)
    return receive if received is None else _whole_body(receive, received)


def _error_body(message: str) -> bytes:
    return orjson.dumps({"error": message})


DEFAULT_MAX_INPUT_SIZE = 64 << 20  # --http-max-input-size, as later Triton releases name it


class HttpApp:
    def __init__(self, api: ServerApi, restrictions: Restrictions | None = None,
                 max_input_size: int = DEFAULT_MAX_INPUT_SIZE):
        self.api = api
        self.restrictions = restrictions  # --http-restricted-api
        self.max_input_size = max_input_size  # a request body's bytes, as received and as inflated
        self.infer_endpoint = InferEndpoint(api, max_input_size)

    @property
    def fast_infer(self) -> InferEndpoint | None:
        """The infer endpoint the protocol may answer without this app: none when API restrictions
        are set, whose headers only this app looks at."""
        return None if self.restrictions else self.infer_endpoint

    def _too_large(self, size: int, what: str = "Request body") -> ServerError:
        return too_large(f"{what} of {size} bytes exceeds the maximum allowed value of {self.max_input_size} "
                         "bytes; use --http-max-input-size to raise the limit")

    async def _read_body(self, receive) -> bytes | memoryview:
        """The whole body, refused with 413 as soon as it passes the limit (a declared
        Content-Length over it is refused before anything is read); a view when the protocol
        received it into one buffer (see `_whole_body`)."""
        chunks = []
        size = 0
        more = True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise ConnectionError("client went away")
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_input_size:
                raise self._too_large(size)
            chunks.append(chunk)
            more = message.get("more_body", False)
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    async def _json_body(self, receive) -> dict:
        """A request body that is a JSON object, or {} when empty."""
        body = bytes(await self._read_body(receive))
        return http_codec.json_object(body) if body.strip() else {}

    async def _inflate(self, body: bytes | memoryview, encoding: str) -> bytes | memoryview:
        encoding = encoding.strip().lower()
        if encoding in ("", "identity"):
            return body
        try:
            return await inflate(body, encoding, self.max_input_size)
        except ValueError:
            raise unsupported(f"unsupported Content-Encoding '{encoding}'; use gzip or deflate") from None
        except TooLarge as e:
            raise self._too_large(e.args[0], "The decompressed request body") from None
        except zlib.error as e:
            raise invalid(f"failed to decompress the request body ({encoding}): {e}") from None

    async def _refused(self, handler: str, scope, send) -> bool:
        """Answer Triton's 403 when the handler's API group is restricted and the header is missing."""
        if not self.restrictions:
            return False
        header = self.restrictions.denial(HTTP_GROUP.get(handler), scope["headers"])
        if header:
            await _send(send, 403, _error_body(http_message(header)))
        return bool(header)

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return
        await self.guarded(scope, send, self._route(scope, body_receive(scope, receive), send))

    async def guarded(self, scope, send, work) -> None:
        """Await `work`, a handler's coroutine: its ServerError answered in Triton's form, a client gone
        away ignored, and a bug of ours answered 500, logged, and served on."""
        try:
            await work
        except ServerError as e:
            await _send(send, e.status.http_status, _error_body(e.message), error_headers(e))
        except ConnectionError:
            pass
        except Exception as e:  # a bug of ours: answer, log, and keep serving
            log.exception("%s %s failed", scope["method"], scope["path"])
            await _send(send, 500, _error_body(f"internal error: {type(e).__name__}: {e}"))

    async def _route(self, scope, receive, send) -> None:
        path = scope["path"]
        method = scope["method"]
        for key, value in scope["headers"]:
            if key == b"content-length" and value.isdigit() and int(value) > self.max_input_size:
                raise self._too_large(int(value))  # refused before a byte of it is read
        m = INFER.fullmatch(path)
        if m is not None:
            if method != "POST":
                await _send(send, 405, _error_body("Method Not Allowed"), _TEXT)
                return
            if not await self._refused("infer", scope, send):
                await self.infer(scope, receive, send, m["model"], m["version"] or "")
            return
        wrong_method = False
        for pattern, want, name in ROUTES:
            m = pattern.fullmatch(path)
            if m is not None:
                if method != want:
                    wrong_method = True
                    continue
                if not await self._refused(name, scope, send):
                    await getattr(self, name)(receive, send, **m.groupdict())
                return
        if wrong_method:
            await _send(send, 405, _error_body("Method Not Allowed"), _TEXT)
            return
        await _send(send, 404, _error_body("Not Found"), _TEXT)

    # -- health and metadata ---------------------------------------------------------------
    async def live(self, receive, send) -> None:
        await _send(send, 200 if self.api.live() else 400, b"", _TEXT)

    async def ready(self, receive, send) -> None:
        await _send(send, 200 if await self.api.ready() else 400, b"", _TEXT)

    async def server_metadata(self, receive, send) -> None:
        doc = {"name": self.api.settings.server_id, "version": __version__, "extensions": EXTENSIONS}
        await _send(send, 200, orjson.dumps(doc))

    async def model_metadata(self, receive, send, model: str, version: str | None) -> None:
        await _send(send, 200, orjson.dumps(await self.api.model_metadata(model, version or "")))

    async def model_ready(self, receive, send, model: str, version: str | None) -> None:
        if await self.api.model_ready(model, version or ""):
            await _send(send, 200, b"", _TEXT)
        else:
            await _send(send, 400, _error_body("Model version not ready"), _TEXT)

    async def model_config(self, receive, send, model: str, version: str | None) -> None:
        await _send(send, 200, orjson.dumps(await self.api.model_config(model, version or "")))

    async def model_stats(self, receive, send, model: str, version: str | None) -> None:
        await _send(send, 200, orjson.dumps(self.api.statistics(model, version or "")))

    async def all_stats(self, receive, send) -> None:
        await _send(send, 200, orjson.dumps(self.api.statistics("", "")))

    # -- the generate extension ----------------------------------------------------------------
    async def _generate_request(self, receive, model: str, version: str | None):
        mv = await self.api.resolve(model, version or "")  # an unknown model is said before the body is read
        doc = generate.parse(bytes(await self._read_body(receive)))
        return generate.decode(doc, model, version or "", mv.inputs, mv.max_batch_size)

    async def generate(self, receive, send, model: str, version: str | None) -> None:
        request = await self._generate_request(receive, model, version)
        responses = []
        async for item in self.api.infer_stream(request):
            if isinstance(item, ServerError):
                raise item
            if not item.empty:
                responses.append(item)
        if len(responses) != 1:  # Triton's words; its status is 200 (sent before the responses came)
            raise ServerError("generate expects model to produce exactly 1 response, use generate stream for model "
                              "that generates various number of responses")
        await _send(send, 200, orjson.dumps(generate.encode(responses[0])))

    async def generate_stream(self, receive, send, model: str, version: str | None) -> None:
        """Server-sent events, one `data:` line per response; an error ends the stream as an event."""
        request = await self._generate_request(receive, model, version)
        stream = _with_data(self.api.infer_stream(request))
        try:  # errors before any response still get a status code
            first = await anext(stream, None)
        except ServerError as e:
            if not e.from_model:
                raise  # the request was refused before the model saw it: a JSON error
            first = e  # the model failed: its status, the error as an event
        status = first.status.http_status if isinstance(first, ServerError) else 200
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"text/event-stream; charset=utf-8"),
                                (b"cache-control", b"no-cache")]})
        item = first
        while item is not None:
            event = {"error": item.message} if isinstance(item, ServerError) else generate.encode(item)
            await send({"type": "http.response.body", "body": b"data: " + orjson.dumps(event) + b"\n\n",
                        "more_body": True})
            item = await anext(stream, None)
        await send({"type": "http.response.body", "body": b""})

    # -- tracing -----------------------------------------------------------------------------
    async def trace_get(self, receive, send, model: str = "") -> None:
        await _send(send, 200, orjson.dumps(self.api.trace_settings(model)))

    async def trace_update(self, receive, send, model: str = "") -> None:
        doc = await self._json_body(receive)
        await _send(send, 200, orjson.dumps(self.api.update_trace_settings(doc, model)))

    # -- logging -----------------------------------------------------------------------------
    async def logging_get(self, receive, send) -> None:
        await _send(send, 200, orjson.dumps(self.api.log_settings.settings))

    async def logging_update(self, receive, send) -> None:
        await _send(send, 200, orjson.dumps(self.api.log_settings.update(await self._json_body(receive))))

    # -- the repository API ------------------------------------------------------------------
    async def repository_index(self, receive, send) -> None:
        ready = (await self._json_body(receive)).get("ready", False)
        if type(ready) is not bool:
            raise wrong_json_type("boolean")
        await _send(send, 200, orjson.dumps(await self.api.repository_index(ready)))

    async def repository_load(self, receive, send, model: str) -> None:
        params = (await self._json_body(receive)).get("parameters") or {}
        if not isinstance(params, dict):
            raise ServerError("'parameters' must be a JSON object")
        decoded = {}
        for key, value in params.items():
            if key.startswith("file:"):
                try:
                    value = base64.b64decode(value, validate=True)
                except (binascii.Error, TypeError, ValueError):
                    raise ServerError(f"parameter '{key}' must hold the file's content in base64") from None
            decoded[key] = value
        await self.api.load_model(model, decoded)
        await _send(send, 200, b"")

    async def repository_unload(self, receive, send, model: str) -> None:
        params = (await self._json_body(receive)).get("parameters") or {}
        await self.api.unload_model(model, params if isinstance(params, dict) else {})
        await _send(send, 200, b"")

    # -- client shared memory ----------------------------------------------------------------
    async def shm_status(self, receive, send, kind: str, region: str | None) -> None:
        regions = self.api.shm_status(region or "", kind)
        if kind == "system":
            doc = [{"name": r.name, "key": r.key, "offset": r.offset, "byte_size": r.byte_size} for r in regions]
        else:
            doc = [{"name": r.name, "device_id": r.device_id, "byte_size": r.byte_size} for r in regions]
        await _send(send, 200, orjson.dumps(doc))

    async def shm_register(self, receive, send, kind: str, region: str) -> None:
        self.api.check_shm_allowed()  # before the body is read, as in Triton
        doc = await self._json_body(receive)
        if kind == "cuda":
            handle = doc.get("raw_handle") or {}  # whatever it is, only a valid one passes below
            try:
                raw = base64.b64decode(handle["b64"], validate=True)
            except (TypeError, KeyError, binascii.Error, ValueError):
                raw = b""
            if len(raw) != IPC_HANDLE_SIZE:  # what Triton's HTTP frontend checks before the registration
                raise ServerError("'raw_handle' must be a valid base64 encoded cudaIpcMemHandle_t; a CUDA region "
                                  "registration needs 'raw_handle': {'b64': the 64-byte cudaIpcMemHandle in base64}")
            if not isinstance(doc.get("device_id"), int) or not isinstance(doc.get("byte_size"), int):
                raise ServerError("a CUDA region registration needs 'device_id' and 'byte_size' (integers)")
            self.api.register_cuda_shm(region, raw, doc["device_id"], doc["byte_size"])
        else:
            key, offset, size = doc.get("key"), doc.get("offset", 0), doc.get("byte_size")  # Triton's order
            if key is None:
                raise ServerError("Shared memory register request has no 'key' field")
            if type(key) is not str:
                raise wrong_json_type("string")
            if not unsigned(offset):
                raise wrong_json_type("unsigned-integer")
            if size is None:
                raise ServerError("Shared memory register request has no 'byte_size' field")
            if not unsigned(size):
                raise wrong_json_type("unsigned-integer")
            self.api.register_shm(region, key, offset, size)
        await _send(send, 200, b"", _TEXT)

    async def shm_unregister(self, receive, send, kind: str, region: str | None) -> None:
        await self._read_body(receive)
        self.api.unregister_shm(region or "", kind)
        await _send(send, 200, b"", _TEXT)

    # -- inference -------------------------------------------------------------------------
    async def infer(self, scope, receive, send, model: str, version: str) -> None:
        endpoint = self.infer_endpoint
        mv = endpoint.model(model, version)  # as in Triton, before the body is read
        header_length, content_encoding, accept_encoding = endpoint.headers(scope["headers"])
        body = await self._read_body(receive)
        if content_encoding:
            body = await self._inflate(body, content_encoding)
        if mv is None:  # not loaded yet (--load-on-demand): loaded now
            mv = await endpoint.loaded(model, version)
        if header_length is None and len(body) > json_offload.OFFLOAD_BYTES:
            request, binary_default = await json_offload.decode_infer(body, model, version)
        else:
            request, binary_default = endpoint.decode(body, header_length, model, version, mv)
        # the version is looked up again: reading the body took turns of the loop
        request.trace_context = otel.carrier(scope["headers"])
        response = await endpoint.submit(request, scope.get(FORWARDED_KEY))
        headers, out = endpoint.encode(response, request, binary_default, accept_encoding)
        await _send(send, 200, out, headers)

