"""Google Vertex AI's endpoint (`--allow-vertex-ai`, `--vertex-ai-port`), as Triton serves it: the
health route (AIP_HEALTH_ROUTE) is readiness; the predict route (AIP_PREDICT_ROUTE) is an infer request
for the default model (--vertex-ai-default-model, else the one model loaded), its binary form with
`application/vnd.vertex-ai-triton.binary+json;json-header-size=N`; a POST to the predict route with the
header `X-Vertex-Ai-Triton-Redirect: <route>` reaches Triton's other routes (health, metadata, config,
statistics, infer, shared memory, the repository, metrics). Any other path is a 400."""

from __future__ import annotations

import re

from ..observability.system import SystemSampler
from ..server_api import ServerApi
from .http_server import HttpApp, _send, body_receive
from .mime_infer import mime_infer

BINARY_MIME = "application/vnd.vertex-ai-triton.binary+json;json-header-size="
REDIRECT = b"x-vertex-ai-triton-redirect"
_TEXT = [(b"content-type", b"text/plain")]
_METHOD_NOT_ALLOWED = b'{"error":"Method Not Allowed"}'
# the routes a redirect reaches, and the method each is answered as
_MODEL = re.compile(r"/v2/models/[^/]+(?:/versions/[0-9]+)?(?:/(ready|config|stats|infer))?")
_SHM = re.compile(r"/v2/(?:system|cuda)sharedmemory(?:/region/[^/]+)?/(status|register|unregister)")
_GET = re.compile(r"/v2|/v2/health/(?:live|ready)|/v2/models/stats")
_REPOSITORY = re.compile(r"/v2/repository/(?:index|models/[^/]+/(?:load|unload))")


class VertexAiApp:
    """The Vertex AI routes, over the HTTP frontend's app; `default_model` is settled once the
    startup load has ended (VertexAiListener.loaded)."""

    def __init__(self, api: ServerApi, http: HttpApp, system: SystemSampler, predict_route: str, health_route: str):
        self.api = api
        self.http = http
        self.system = system  # the machine's figures, for the metrics a redirect asks for
        self.predict_route = predict_route
        self.health_route = health_route
        self.default_model = ""

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return
        path, method = scope["path"], scope["method"]
        receive = body_receive(scope, receive)
        if path == self.health_route:
            await self.http(dict(scope, path="/v2/health/ready"), receive, send)
            return
        if path != self.predict_route:
            await _send(send, 400, b"", _TEXT)
            return
        redirect = next((v.decode("latin-1") for k, v in scope["headers"] if k == REDIRECT), None)
        if redirect is None:
            if method != "POST":
                await _send(send, 405, _METHOD_NOT_ALLOWED, _TEXT)
                return
            await self._infer(scope, receive, send, self.default_model, "")
            return
        if method != "POST":
            await _send(send, 405, b"", _TEXT)
            return
        await self._redirect(scope, receive, send, "/" + redirect)

    async def _infer(self, scope, receive, send, model: str, version: str) -> None:
        await self.http.guarded(scope, send, mime_infer(self.http, scope, receive, send, model, version,
                                                        BINARY_MIME, answer_in_content_type=False))

    async def _redirect(self, scope, receive, send, route: str) -> None:
        """Another of Triton's routes, reached through the predict route."""
        if route == "/metrics":
            await _send(send, 200, self.api.metrics_text(self.system), _TEXT)
            return
        model = _MODEL.fullmatch(route)
        if model is not None and model.group(1) == "infer":
            name, _, rest = route[len("/v2/models/"):].partition("/")
            version = rest.split("/")[1] if rest.startswith("versions/") else ""
            await self._infer(dict(scope, path=route), receive, send, name, version)
            return
        shm = _SHM.fullmatch(route)
        if model is not None or _GET.fullmatch(route) or (shm is not None and shm.group(1) == "status"):
            await self.http(dict(scope, path=route, method="GET"), receive, send)
        elif shm is not None or _REPOSITORY.fullmatch(route):
            await self.http(dict(scope, path=route, method="POST"), receive, send)
        else:
            await _send(send, 400, b"", _TEXT)
