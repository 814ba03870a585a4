"""OpenTelemetry traces (--trace-config mode=opentelemetry), as Triton exports them: for each traced
request a top-level "InferRequest" span (the child of the client's span where its request carried a
W3C `traceparent`), a span named after the model (triton.model_name, triton.model_version,
triton.trace_id, triton.trace_parent_id; events REQUEST_START, QUEUE_START, REQUEST_END) and under it
a "compute" span (COMPUTE_START, COMPUTE_INPUT_END, COMPUTE_OUTPUT_START, COMPUTE_END); an ensemble's
steps are model spans under the ensemble's. Spans go over OTLP/HTTP (protobuf) to `url`, batched by
a processor of this module on a thread of its own: a request never waits for the export, and a span
that finds the queue full is dropped and counted.

The OpenTelemetry SDK and OTLP exporter are the `otel` extra: imported only when this mode is on."""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from typing import Any

from ..errors import invalid

# Triton's settings of the mode (--trace-config opentelemetry,KEY=VALUE) and their defaults
SETTINGS = {"url": "http://localhost:4318/v1/traces", "resource": "service.name=triton-inference-server",
            "bsp_max_queue_size": "2048", "bsp_schedule_delay": "5000", "bsp_max_export_batch_size": "512"}
CARRIER_KEYS = ("traceparent", "tracestate")
SHUTDOWN_WAIT_S = 3.0  # how long a server that stops waits for its last spans' export
SCOPE = "triton-server"
MODEL_EVENTS = ("REQUEST_START", "QUEUE_START", "REQUEST_END")
COMPUTE_EVENTS = ("COMPUTE_START", "COMPUTE_INPUT_END", "COMPUTE_OUTPUT_START", "COMPUTE_END")


def check_settings(settings: dict[str, str]) -> dict[str, str]:
    """The mode's settings, checked, with Triton's defaults for those not given (its resource only
    where given: Triton's settings answer names it only then)."""
    out = {k: v for k, v in SETTINGS.items() if k != "resource"}
    for key, value in settings.items():
        if key not in SETTINGS:
            raise invalid(f"unknown opentelemetry trace setting '{key}'; known: {', '.join(SETTINGS)}")
        if key.startswith("bsp_") and not (value.isdigit() and int(value) > 0):
            raise invalid(f"opentelemetry trace setting '{key}' must be a positive whole number, got '{value}'")
        if key == "resource" and not all("=" in pair for pair in value.split(",")):
            raise invalid(f"opentelemetry trace setting 'resource' must be KEY=VALUE, got '{value}'")
        out[key] = value
    if int(out["bsp_max_export_batch_size"]) > int(out["bsp_max_queue_size"]):
        raise invalid("opentelemetry trace setting bsp_max_export_batch_size must not exceed bsp_max_queue_size")
    return out


def carrier(items) -> dict[str, str] | None:
    """The W3C trace context among request headers or gRPC metadata ((name, value) pairs), if any."""
    found = None
    for name, value in items:
        if isinstance(name, bytes):
            name = name.decode("latin-1")
        name = name.lower()
        if name in CARRIER_KEYS:
            found = found or {}
            found[name] = value.decode("latin-1") if isinstance(value, bytes) else str(value)
    return found


class BoundedSpanProcessor:
    """The SDK's span processor contract: ended spans queue (at most `max_queue` of them, the rest
    dropped and counted) and are exported from a thread of their own, `batch` at a time, every
    `delay_s` or as soon as a batch is full."""

    def __init__(self, exporter, max_queue: int, delay_s: float, batch: int):
        self.exporter = exporter
        self.max_queue, self.delay_s, self.batch = max_queue, delay_s, batch
        self.queue: deque = deque()
        self.dropped = 0
        self.exported = 0
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="tritonmp-otel-export", daemon=True)
        self._thread.start()

    def on_start(self, span, parent_context=None) -> None:
        pass

    def _on_ending(self, span) -> None:
        pass

    def on_end(self, span) -> None:
        with self._lock:
            if len(self.queue) >= self.max_queue:
                self.dropped += 1
                return
            self.queue.append(span)
            full = len(self.queue) >= self.batch
        if full:
            self._wake.set()

    def _take(self) -> list:
        with self._lock:
            return [self.queue.popleft() for _ in range(min(self.batch, len(self.queue)))]

    def _run(self) -> None:
        while True:
            self._wake.wait(self.delay_s)
            self._wake.clear()
            self._export_all()
            if self._stopping:  # what was queued when shutdown came has been exported
                return

    def _export_all(self) -> None:
        while True:
            spans = self._take()
            if not spans:
                return
            try:
                ok = self.exporter.export(spans).name == "SUCCESS"  # SpanExportResult
            except Exception:  # noqa: BLE001 - a receiver that is down loses these spans, not the server
                ok = False
            with self._lock:
                if ok:
                    self.exported += len(spans)
                else:
                    self.dropped += len(spans)

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        self._export_all()
        return True

    def shutdown(self) -> None:
        """Export what is queued, for up to SHUTDOWN_WAIT_S; an export still retrying then is cut
        short, and the spans it had, or still queued, count as dropped."""
        self._stopping = True
        self._wake.set()
        self._thread.join(timeout=SHUTDOWN_WAIT_S)
        self.exporter.shutdown()
        self._thread.join(timeout=SHUTDOWN_WAIT_S)
        with self._lock:
            self.dropped += len(self.queue)
            self.queue.clear()


class OtelExport:
    """The SDK's tracer provider with the OTLP/HTTP exporter, and how a traced request's spans are
    made from its timestamps (Trace.mark, on the monotonic clock)."""

    def __init__(self, settings: dict[str, str]):
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
            from opentelemetry.sdk.resources import Resource
            from opentelemetry.sdk.trace import TracerProvider
            from opentelemetry.trace import SpanKind
            from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
        except ImportError:
            raise invalid("--trace-config mode=opentelemetry needs the OpenTelemetry SDK and OTLP exporter: "
                          "pip install 'tritonmp[otel]'") from None
        from opentelemetry import trace as ot

        self.settings = settings
        resource = settings.get("resource", SETTINGS["resource"])
        attributes = dict(pair.split("=", 1) for pair in resource.split(","))
        url = settings["url"] if "://" in settings["url"] else f"http://{settings['url']}"
        self.processor = BoundedSpanProcessor(OTLPSpanExporter(endpoint=url), int(settings["bsp_max_queue_size"]),
                                              int(settings["bsp_schedule_delay"]) / 1000,
                                              int(settings["bsp_max_export_batch_size"]))
        self.provider = TracerProvider(resource=Resource.create(attributes))
        self.provider.add_span_processor(self.processor)  # type: ignore[arg-type]
        self.tracer = self.provider.get_tracer(SCOPE)
        self.propagator = TraceContextTextMapPropagator()
        self.server_kind = SpanKind.SERVER
        self.in_context = ot.set_span_in_context
        self.offset_ns = time.time_ns() - time.monotonic_ns()  # monotonic -> wall clock

    def wall(self, monotonic_ns: int) -> int:
        return monotonic_ns + self.offset_ns

    def start(self, model: str, version: int, trace_id: int, start_ns: int, parent_spans: Any = None,
              carrier_: dict[str, str] | None = None, parent_id: int = 0, top: bool = True) -> tuple[Any, Any]:
        """The spans of a traced request, begun: (its InferRequest span, or None for an ensemble's
        step or a BLS call; its model span). `parent_spans`: an ensemble's; `carrier_`: the W3C
        context of the client's span, or with `top` false of the calling model's span (BLS)."""
        top_span = None
        context: Any
        if parent_spans is not None:
            context = self.in_context(parent_spans[1])
        else:
            context = self.propagator.extract(carrier_) if carrier_ else None
            if top:
                top_span = self.tracer.start_span("InferRequest", context=context, kind=self.server_kind,
                                                  start_time=self.wall(start_ns))
                context = self.in_context(top_span)
        span = self.tracer.start_span(model, context=context, kind=self.server_kind,
                                      start_time=self.wall(start_ns),
                                      attributes={"triton.model_name": model, "triton.model_version": version,
                                                  "triton.trace_id": trace_id, "triton.trace_parent_id": parent_id})
        return top_span, span

    def context(self, spans: tuple[Any, Any]) -> str:
        """The W3C context of a traced request's model span, as JSON: what its BLS calls and the
        model's own spans take as their parent (pb_utils.InferenceTrace.get_context())."""
        carrier: dict[str, str] = {}
        self.propagator.inject(carrier, context=self.in_context(spans[1]))
        return json.dumps(carrier)

    def end(self, spans: tuple[Any, Any], timestamps: list[tuple[str, int]]) -> None:
        """A traced request is done: its events, its compute span, and its spans ended."""
        top, span = spans
        marks = dict(timestamps)
        for name in MODEL_EVENTS:
            if name in marks:
                span.add_event(name, timestamp=self.wall(marks[name]))
        if "COMPUTE_START" in marks and "COMPUTE_END" in marks:
            compute = self.tracer.start_span("compute", context=self.in_context(span), kind=self.server_kind,
                                             start_time=self.wall(marks["COMPUTE_START"]))
            for name in COMPUTE_EVENTS:
                if name in marks:
                    compute.add_event(name, timestamp=self.wall(marks[name]))
            compute.end(end_time=self.wall(marks["COMPUTE_END"]))
        end = self.wall(marks.get("REQUEST_END", time.monotonic_ns()))
        span.end(end_time=end)
        if top is not None:
            top.add_event("INFER_RESPONSE_COMPLETE", timestamp=end)
            top.end(end_time=end)

    def dropped(self) -> int:
        return self.processor.dropped

    def close(self) -> None:
        self.provider.shutdown()
