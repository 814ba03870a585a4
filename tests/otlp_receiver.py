"""An OTLP/HTTP trace receiver for the tests: it decodes each export request (protobuf, or JSON as
some exporters send) with the `opentelemetry-proto` package and keeps the spans, flattened."""

from __future__ import annotations

import base64
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from conftest import free_port


def _hex_ids_as_base64(export: dict) -> dict:
    """OTLP/JSON writes trace and span ids in hex, where protobuf's JSON mapping reads bytes as base64."""
    for resource_spans in export.get("resourceSpans", ()):
        for scope_spans in resource_spans.get("scopeSpans", ()):
            for span in scope_spans.get("spans", ()):
                for key in ("traceId", "spanId", "parentSpanId"):
                    if span.get(key):
                        span[key] = base64.b64encode(bytes.fromhex(span[key])).decode()
    return export


def _value(v):
    kind = v.WhichOneof("value")
    return getattr(v, kind) if kind else None


class OtlpReceiver:
    """Listens on 127.0.0.1 at `url`; `spans` are dicts: name, trace, id, parent (hex), kind,
    attributes, events (names), resource (attributes), scope, content_type."""

    def __init__(self) -> None:
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

        self.spans: list[dict] = []
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - the http.server name
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                export = ExportTraceServiceRequest()
                content_type = self.headers.get("Content-Type", "")
                if content_type.startswith("application/json"):
                    from google.protobuf import json_format

                    json_format.ParseDict(_hex_ids_as_base64(json.loads(body)), export, ignore_unknown_fields=True)
                else:
                    export.ParseFromString(body)
                receiver._keep(export, content_type)
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args) -> None:
                pass

        self.port = free_port()
        self.url = f"127.0.0.1:{self.port}/v1/traces"
        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def _keep(self, export, content_type: str) -> None:
        with self.lock:
            for resource_spans in export.resource_spans:
                resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
                for scope_spans in resource_spans.scope_spans:
                    for s in scope_spans.spans:
                        self.spans.append({
                            "name": s.name, "trace": s.trace_id.hex(), "id": s.span_id.hex(),
                            "parent": s.parent_span_id.hex(), "kind": s.kind,
                            "attributes": {a.key: _value(a.value) for a in s.attributes},
                            "events": [e.name for e in s.events], "resource": resource,
                            "scope": scope_spans.scope.name, "content_type": content_type})

    def of_trace(self, trace_id: str) -> list[dict]:
        with self.lock:
            return [s for s in self.spans if s["trace"] == trace_id]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)
