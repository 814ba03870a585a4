"""OpenTelemetry traces (--trace-config mode=opentelemetry), as Triton exports them: for each traced
request a top-level "InferRequest" span (the child of the client's span where its request carried a
W3C `traceparent`), a span named after the model (triton.model_name, triton.model_version,
triton.trace_id, triton.trace_parent_id; events REQUEST_START, QUEUE_START, REQUEST_END) and under it
a "compute" span (COMPUTE_START, COMPUTE_INPUT_END, COMPUTE_OUTPUT_START, COMPUTE_END); an ensemble's
steps and a BLS call made with its caller's trace are model spans under their caller's.

On the event loop a traced request costs its span ids and a record of its timestamps; the OTLP
messages are built from the records, and sent over OTLP/HTTP (protobuf) to `url`, on a thread of
this module: a request never waits for the export, and a span that finds the queue full, or that the
receiver does not take, is dropped and counted.

The OTLP messages are those of the `opentelemetry-proto` package (the `otel` extra): imported only
when this mode is on."""

from __future__ import annotations

import json
import random
import re
import threading
import time
import urllib.request
from collections import deque
from dataclasses import dataclass
from typing import Any

from ..errors import invalid

# Triton's settings of the mode (--trace-config opentelemetry,KEY=VALUE) and their defaults
SETTINGS = {"url": "http://localhost:4318/v1/traces", "resource": "service.name=triton-inference-server",
            "bsp_max_queue_size": "2048", "bsp_schedule_delay": "5000", "bsp_max_export_batch_size": "512"}
CARRIER_KEYS = ("traceparent", "tracestate")
SHUTDOWN_WAIT_S = 3.0  # how long a server that stops waits for its last spans' export
EXPORT_TIMEOUT_S = 10.0  # one export request to the receiver
SCOPE = "triton-server"
MODEL_EVENTS = ("REQUEST_START", "QUEUE_START", "REQUEST_END")
COMPUTE_EVENTS = ("COMPUTE_START", "COMPUTE_INPUT_END", "COMPUTE_OUTPUT_START", "COMPUTE_END")
_TRACEPARENT = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")
_ids = random.Random()  # span and trace ids (seeded from the system's entropy)


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


def _new_id(nbytes: int) -> bytes:
    while True:
        value = _ids.getrandbits(8 * nbytes)
        if value:
            return value.to_bytes(nbytes, "big")


def parse_traceparent(context: dict[str, str] | None) -> tuple[bytes, bytes, str] | None:
    """(trace id, parent span id, tracestate) of a W3C context; None for none, or one not valid."""
    if not context:
        return None
    match = _TRACEPARENT.fullmatch(context.get("traceparent", "").strip().lower())
    if match is None or match.group(1) == "ff":
        return None
    trace_id, span_id = bytes.fromhex(match.group(2)), bytes.fromhex(match.group(3))
    if not any(trace_id) or not any(span_id):
        return None
    return trace_id, span_id, context.get("tracestate", "")


@dataclass(slots=True)
class Spans:
    """The ids of a traced request's spans, made when it starts; its spans are built when it ends."""

    trace_id: bytes
    top_id: bytes | None  # its InferRequest span; None for an ensemble's step or a BLS call
    model_id: bytes
    parent_id: bytes  # the parent of its first span (the client's, the ensemble's, the BLS caller's), or b""
    trace_state: str
    model: str
    version: int
    trace_number: int  # Triton's trace id and parent id, as the model span's attributes
    parent_number: int
    start_ns: int  # monotonic


class OtelExport:
    """The export of traced requests' spans: their ids made on the loop (`start`), their records
    queued (`end`), and the export thread that builds and sends the OTLP messages."""

    def __init__(self, settings: dict[str, str]):
        try:
            from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
            from opentelemetry.proto.common.v1 import common_pb2
            from opentelemetry.proto.trace.v1 import trace_pb2
        except ImportError:
            raise invalid("--trace-config mode=opentelemetry needs the OTLP messages: pip install 'tritonmp[otel]'") \
                from None
        self.pb, self.common, self.service = trace_pb2, common_pb2, trace_service_pb2
        self.settings = settings
        url = settings["url"]
        self.url = url if "://" in url else f"http://{url}"
        resource = settings.get("resource", SETTINGS["resource"])
        self.resource = [self._attribute(k, v) for k, v in (pair.split("=", 1) for pair in resource.split(","))]
        self.max_queue = int(settings["bsp_max_queue_size"])
        self.delay_s = int(settings["bsp_schedule_delay"]) / 1000
        self.batch = int(settings["bsp_max_export_batch_size"])
        self.offset_ns = time.time_ns() - time.monotonic_ns()  # monotonic -> wall clock
        self.queue: deque[tuple[Spans, list[tuple[str, int]], int, int]] = deque()
        self.queued_spans = 0
        self.dropped = 0
        self.exported = 0
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="tritonmp-otel-export", daemon=True)
        self._thread.start()

    # -- on the loop ---------------------------------------------------------------------------
    def start(self, model: str, version: int, trace_number: int, start_ns: int, parent: Spans | None = None,
              context: dict[str, str] | None = None, parent_number: int = 0, top: bool = True) -> Spans:
        """The span ids of a traced request. `parent`: an ensemble's; `context`: the W3C context of
        the client's span, or with `top` false of the calling model's span (a BLS call)."""
        if parent is not None:
            trace_id, parent_id, state, top = parent.trace_id, parent.model_id, parent.trace_state, False
        else:
            found = parse_traceparent(context)
            trace_id, parent_id, state = found if found is not None else (_new_id(16), b"", "")
        return Spans(trace_id, _new_id(8) if top else None, _new_id(8), parent_id, state, model, version,
                     trace_number, parent_number, start_ns)

    @staticmethod
    def context(spans: Spans) -> str:
        """The W3C context of a traced request's model span, as JSON: what its BLS calls and the
        model's own spans take as their parent (pb_utils.InferenceTrace.get_context())."""
        out = {"traceparent": f"00-{spans.trace_id.hex()}-{spans.model_id.hex()}-01"}
        if spans.trace_state:
            out["tracestate"] = spans.trace_state
        return json.dumps(out)

    def end(self, spans: Spans, timestamps: list[tuple[str, int]]) -> None:
        """A traced request is done: its record queues for the export, or is dropped (and counted)
        where the queue holds bsp_max_queue_size spans already."""
        marks = {name for name, _ in timestamps}
        count = 1 + (spans.top_id is not None) + ("COMPUTE_START" in marks and "COMPUTE_END" in marks)
        with self._lock:
            if self.queued_spans + count > self.max_queue:
                self.dropped += count
                return
            self.queue.append((spans, timestamps, time.monotonic_ns(), count))
            self.queued_spans += count
            full = self.queued_spans >= self.batch
        if full:
            self._wake.set()

    # -- on the export thread -------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            self._wake.wait(self.delay_s)
            self._wake.clear()
            self._export_all()
            if self._stopping:  # what was queued when shutdown came has been exported
                return

    def _take(self) -> tuple[list, int]:
        records, count = [], 0
        with self._lock:
            while self.queue and count < self.batch:
                record = self.queue.popleft()
                records.append(record)
                count += record[3]
            self.queued_spans -= count
        return records, count

    def _export_all(self) -> None:
        while True:
            records, count = self._take()
            if not records:
                return
            ok = self._send(self._request(records))
            with self._lock:
                if ok:
                    self.exported += count
                else:
                    self.dropped += count

    def _send(self, body: bytes) -> bool:
        request = urllib.request.Request(self.url, body, {"Content-Type": "application/x-protobuf"}, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=EXPORT_TIMEOUT_S) as answer:
                answer.read()
                return 200 <= answer.status < 300
        except (OSError, ValueError):  # a receiver that is down or refuses loses these spans, not the server
            return False

    def _attribute(self, key: str, value: Any):
        common = self.common
        if isinstance(value, bool):
            any_value = common.AnyValue(bool_value=value)
        elif isinstance(value, int):
            any_value = common.AnyValue(int_value=value)
        else:
            any_value = common.AnyValue(string_value=str(value))
        return common.KeyValue(key=key, value=any_value)

    def _request(self, records: list) -> bytes:
        """The OTLP export request of some records: their spans, under this server's resource."""
        pb = self.pb
        server = pb.Span.SPAN_KIND_SERVER
        wall = self.offset_ns
        spans = []
        for s, timestamps, ended, _ in records:
            marks = dict(timestamps)
            end = marks.get("REQUEST_END", ended) + wall
            start = s.start_ns + wall
            if s.top_id is not None:
                spans.append(pb.Span(trace_id=s.trace_id, span_id=s.top_id, parent_span_id=s.parent_id,
                                     trace_state=s.trace_state, name="InferRequest", kind=server,
                                     start_time_unix_nano=start, end_time_unix_nano=end,
                                     events=[pb.Span.Event(time_unix_nano=end, name="INFER_RESPONSE_COMPLETE")]))
            attributes = [self._attribute("triton.model_name", s.model),
                          self._attribute("triton.model_version", s.version),
                          self._attribute("triton.trace_id", s.trace_number),
                          self._attribute("triton.trace_parent_id", s.parent_number)]
            spans.append(pb.Span(
                trace_id=s.trace_id, span_id=s.model_id, parent_span_id=s.top_id or s.parent_id,
                trace_state=s.trace_state, name=s.model, kind=server, start_time_unix_nano=start,
                end_time_unix_nano=end, attributes=attributes,
                events=[pb.Span.Event(time_unix_nano=marks[n] + wall, name=n) for n in MODEL_EVENTS if n in marks]))
            if "COMPUTE_START" in marks and "COMPUTE_END" in marks:
                spans.append(pb.Span(
                    trace_id=s.trace_id, span_id=_new_id(8), parent_span_id=s.model_id, trace_state=s.trace_state,
                    name="compute", kind=server, start_time_unix_nano=marks["COMPUTE_START"] + wall,
                    end_time_unix_nano=marks["COMPUTE_END"] + wall,
                    events=[pb.Span.Event(time_unix_nano=marks[n] + wall, name=n) for n in COMPUTE_EVENTS
                            if n in marks]))
        from opentelemetry.proto.resource.v1 import resource_pb2

        export = self.service.ExportTraceServiceRequest(resource_spans=[pb.ResourceSpans(
            resource=resource_pb2.Resource(attributes=self.resource),
            scope_spans=[pb.ScopeSpans(scope=self.common.InstrumentationScope(name=SCOPE), spans=spans)])])
        return export.SerializeToString()

    # -- the server's ----------------------------------------------------------------------------
    def close(self) -> None:
        """Export what is queued, for up to SHUTDOWN_WAIT_S; what is left then counts as dropped."""
        self._stopping = True
        self._wake.set()
        self._thread.join(timeout=SHUTDOWN_WAIT_S)
        with self._lock:
            self.dropped += self.queued_spans
            self.queue.clear()
            self.queued_spans = 0
