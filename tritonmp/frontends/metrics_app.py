"""The metrics port's ASGI app: GET /metrics (Triton's Prometheus text), GET /status.json (the
status document) and GET / (the status page that reads it, status_page.html); 404 elsewhere, as
Triton."""

from __future__ import annotations

import functools
from pathlib import Path

import orjson
from prometheus_client import CONTENT_TYPE_LATEST

from ..observability.system import SystemSampler
from ..reports.status import StatusHistory
from ..server_api import ServerApi


class MetricsApp:
    """ASGI app for the metrics port: GET /metrics (Triton's), and tritonmp's live status page (GET /)
    with the JSON it reads (GET /status.json); 404 elsewhere, as Triton."""

    def __init__(self, api: ServerApi, system: SystemSampler, history: StatusHistory):
        self.api = api
        self.system = system
        self.history = history

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return
        path, method = scope["path"], scope["method"]
        headers = []
        if method not in ("GET", "HEAD") or path not in ("/metrics", "/", "/status.json"):
            status, body, ctype = 404, b"", b"text/plain"
        elif path == "/metrics":
            status, body, ctype = 200, self.api.metrics_text(self.system), CONTENT_TYPE_LATEST.encode()
        elif path == "/status.json":
            status, ctype = 200, b"application/json"
            body = orjson.dumps(self.api.status_document(self.system, self.history))
            headers.append((b"cache-control", b"no-store"))
        else:
            status, body, ctype = 200, status_page(), b"text/html; charset=utf-8"
            headers.append((b"content-security-policy",
                            b"default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
                            b"connect-src 'self'; img-src 'self' data:"))
        headers += [(b"content-type", ctype), (b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": b"" if method == "HEAD" else body})


@functools.cache
def status_page() -> bytes:
    """The status page: one self-contained file shipped in the package (no CDN, works air-gapped)."""
    return (Path(__file__).parent / "status_page.html").read_bytes()
