"""Amazon SageMaker's endpoint (`--allow-sagemaker`, `--sagemaker-port`), as Triton serves it:
`GET /ping` (readiness, or liveness with SAGEMAKER_TRITON_PING_MODE=live), `POST /invocations` to the
model SAGEMAKER_TRITON_DEFAULT_MODEL_NAME names (as an infer, a generate or a generate_stream request,
by SAGEMAKER_TRITON_INFERENCE_TYPE), the body in KServe v2 JSON, or JSON and binary tensors with the
header's length in the Content-Type (`application/vnd.sagemaker-triton.binary+json;json-header-size=N`);
and the multi-model endpoint: `GET /models`, `POST /models` (load a model from the `url` given, under the
`model_name` given), `GET /models/{name}`, `DELETE /models/{name}`, `POST /models/{name}/invoke`. It
answers through the HTTP frontend's handlers; only the routes, the Content-Type of binary bodies and
the statuses of its own answers are its own."""

from __future__ import annotations

import os
import re

import orjson

from ..errors import ServerError, Status, invalid
from ..logs import get_logger
from ..server_api import ServerApi
from .http_codec import UNPARSABLE
from .http_server import HttpApp, _send, body_receive
from .mime_infer import mime_infer

log = get_logger("http")

BINARY_MIME = "application/vnd.sagemaker-triton.binary+json;json-header-size="
INFERENCE_TYPES = ("infer", "generate", "generate_stream")
_TEXT = [(b"content-type", b"text/plain")]
_MODELS = re.compile(r"/models(?:/)?([^/]+)?(/invoke)?")
_ENSEMBLE = re.compile(r'platform:\s*"ensemble"')
# what a framework's error says when memory ran out: SageMaker is told 507 for these
_OUT_OF_MEMORY = ("CUDA out of memory", "CUDA_OUT_OF_MEMORY", "Out of memory", "Out Of Memory", "out of memory",
                  "MemoryError", "OutOfMemory", "OOM", "Dst tensor is not initialized", "Src tensor is not initialized",
                  "CNMEM_STATUS_OUT_OF_MEMORY", "CUDNN_STATUS_NOT_INITIALIZED", "CUBLAS_STATUS_ALLOC_FAILED",
                  "CUBLAS_STATUS_NOT_INITIALIZED", "Failed to allocate memory", "failed to allocate memory",
                  "No space left on device")


def _error(message: str) -> bytes:
    return orjson.dumps({"error": message})


def _failed_status(message: str) -> int:
    """SageMaker's status for a failed load or a failed multi-model invoke: 507 where memory ran out."""
    return 507 if any(words in message for words in _OUT_OF_MEMORY) else 400


class SagemakerApp:
    """The SageMaker routes, over the HTTP frontend's app. `loaded`: the models loaded through the
    multi-model endpoint, by the name SageMaker gave, with the repository registered for each (the
    folder above the model's own where its URL holds config.pbtxt, else the URL)."""

    def __init__(self, api: ServerApi, http: HttpApp, ping_mode: str, default_model: str, inference_type: str):
        self.api = api
        self.http = http
        self.ping_mode = ping_mode
        self.default_model = default_model
        self.inference_type = inference_type
        self.loaded: dict[str, str] = {}

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return
        await self.http.guarded(scope, send, self._route(scope, body_receive(scope, receive), send))

    async def _route(self, scope, receive, send) -> None:
        path, method = scope["path"], scope["method"]
        if path == "/ping":
            if method != "GET":
                await _send(send, 405, _error("Method Not Allowed"), _TEXT)
                return
            up = self.api.live() if self.ping_mode == "live" else await self.api.ready()
            await _send(send, 200 if up else 400, b"", _TEXT)
        elif path == "/invocations":
            if method != "POST":
                await _send(send, 405, _error("Method Not Allowed"), _TEXT)
                return
            await self._invoke(scope, receive, send, self.default_model)
        elif (m := _MODELS.fullmatch(path)) is not None:
            await self._models(scope, receive, send, method, m.group(1) or "", m.group(2) or "")
        else:
            await _send(send, 400, b"", _TEXT)

    # -- invocations ----------------------------------------------------------------------------
    async def _invoke(self, scope, receive, send, model: str, multi_model: bool = False) -> None:
        """An infer (or generate) request of the body, for `model`; a binary answer says its JSON
        header's length in its Content-Type too."""
        if self.inference_type != "infer" and not multi_model:
            handler = self.http.generate if self.inference_type == "generate" else self.http.generate_stream
            await handler(receive, send, model, "")
            return
        try:
            await mime_infer(self.http, scope, receive, send, model, "", BINARY_MIME, answer_in_content_type=True)
        except ServerError as e:
            if multi_model:
                await _send(send, _failed_status(e.message), _error(e.message))
            elif e.message.startswith(UNPARSABLE):  # Triton's SageMaker endpoint says 500 for it
                await _send(send, 500, _error(e.message))
            else:
                raise

    # -- the multi-model endpoint ---------------------------------------------------------------
    async def _models(self, scope, receive, send, method: str, name: str, action: str) -> None:
        if method == "POST" and action:
            if name not in self.loaded:
                await _send(send, 404, b"", _TEXT)
                return
            target = _target_model(scope) or name  # the model SageMaker names in its header, as Triton takes it
            log.info("invoking SageMaker target model %s", target)
            await self._invoke(scope, receive, send, target, multi_model=True)
            return
        if method not in ("GET", "POST", "DELETE") or (method == "GET" and action):
            await _send(send, 400, b"", _TEXT)
            return
        if await self.http._refused("repository_index", scope, send):
            return
        if method == "GET" and not name:
            ready = [(n, url) for n, url in self.loaded.items() if await self.api.model_ready(n, "")]
            body = {"models": [{"modelName": n, "modelUrl": url} for n, url in ready]}
            await _send(send, 200, orjson.dumps(body), _TEXT)
        elif method == "GET":
            if name not in self.loaded:
                await _send(send, 404, b"", _TEXT)
                return
            await _send(send, 200, orjson.dumps({"modelName": name, "modelUrl": self.loaded[name]}), _TEXT)
        elif method == "POST":
            await self._load(scope, receive, send)
        else:
            await self._unload(send, name, _target_model(scope) or name)

    async def _load(self, scope, receive, send) -> None:
        """Load the model at `url` for SageMaker's `model_name`, served under the name of the header
        X-Amzn-SageMaker-Target-Model (else `model_name`), as Triton serves it: its repository is
        registered with that name for the model's folder (the folder itself where it holds
        config.pbtxt; else the ensemble among its folders, or its one folder), then loaded; a failed
        load unregisters it again."""
        body = await self.http._json_body(receive)
        name, url = body.get("model_name", ""), body.get("url", "")
        if not isinstance(name, str) or not isinstance(url, str):
            raise invalid("'model_name' and 'url' must be strings")
        target = _target_model(scope) or name
        where = os.path.abspath(os.path.normpath(url or "."))
        if where.startswith(("/dev/", "/proc/", "/sys/")):
            await _send(send, 400, b"", _TEXT)
            return
        repository, folder = _model_folder(where)
        try:
            self.api.register_repository(repository, {folder: target})
        except ServerError as e:
            status = 409 if e.status is Status.ALREADY_EXISTS else 400
            await _send(send, status, _error(e.message), _TEXT)
            return
        try:
            await self.api.load_model(target, {})
        except ServerError as e:
            self.api.unregister_repository(repository)
            await _send(send, _failed_status(e.message), _error(e.message), _TEXT)
            return
        self.loaded[name] = repository  # what Triton lists as the model's URL: the repository registered
        log.info("loaded SageMaker target model %s from %s", target, url)
        await _send(send, 200, b"", _TEXT)

    async def _unload(self, send, name: str, target: str) -> None:
        if name not in self.loaded:
            await _send(send, 404, b"", _TEXT)
            return
        try:
            await self.api.unload_model(target, {"unload_dependents": True})
        except ServerError as e:
            await _send(send, 400, _error(e.message), _TEXT)
            return
        self.api.unregister_repository(self.loaded.pop(name))
        await _send(send, 200, b"", _TEXT)


def _model_folder(where: str) -> tuple[str, str]:
    """The repository and the model's folder in it for a multi-model load's URL."""
    if os.path.isfile(os.path.join(where, "config.pbtxt")):
        return os.path.dirname(where), os.path.basename(where)
    folders = sorted(f for f in os.listdir(where) if os.path.isdir(os.path.join(where, f))) \
        if os.path.isdir(where) else []
    for folder in folders:
        try:
            with open(os.path.join(where, folder, "config.pbtxt"), encoding="utf-8", errors="replace") as f:
                if _ENSEMBLE.search(f.read()):
                    return where, folder
        except OSError:
            continue
    return where, folders[-1] if folders else ""


def _target_model(scope) -> str:
    for key, value in scope["headers"]:
        if key == b"x-amzn-sagemaker-target-model":
            return value.decode("latin-1")
    return ""
