"""OpenTelemetry traces (--trace-config mode=opentelemetry) exported to a real OTLP/HTTP receiver
started by the test: a client's W3C `traceparent` (HTTP header or gRPC metadata) is the parent of
the server's spans, Triton's span tree (InferRequest, the model's span, compute) with its events and
attributes, an ensemble's step and a python model's BLS call under their caller's span, the
context a python model reads with `request.trace().get_context()`, and the trace settings Triton
answers in this mode."""

from __future__ import annotations

import json
import os
import time

import numpy as np
import orjson
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from test_model_namespacing import ENSEMBLE, IO, STEP_PY

from conftest import scrape_metrics, wait_for, write_model

pytest.importorskip("opentelemetry.proto", reason="the otel extra is not installed")

from otlp_receiver import OtlpReceiver  # noqa: E402 - needs the opentelemetry packages checked above

CALLER_PY = """import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            called = pb_utils.InferenceRequest(model_name="step", requested_output_names=["Y"],
                inputs=[pb_utils.get_input_tensor_by_name(r, "X")], trace=r.trace()).exec()
            if called.has_error():
                raise pb_utils.TritonModelException(called.error().message())
            context = r.trace().get_context() or ""
            out.append(pb_utils.InferenceResponse([pb_utils.get_output_tensor_by_name(called, "Y"),
                pb_utils.Tensor("CTX", np.array([context.encode()], dtype=np.object_))]))
        return out
"""
CALLER_IO = IO + 'output [ { name: "CTX", data_type: TYPE_STRING, dims: [ 1 ] } ]\n'


@pytest.fixture
def receiver():
    r = OtlpReceiver()
    yield r
    r.close()


def _otel_flags(receiver: OtlpReceiver, *settings: str) -> list[str]:
    """The flags of a server exporting its spans to `receiver` every 50 ms, and `settings` more."""
    return [f"--trace-config={s}" for s in ("mode=opentelemetry", "level=TIMESTAMPS",
                                             f"opentelemetry,url={receiver.url}",
                                             "opentelemetry,bsp_schedule_delay=50", *settings)]


def _traceparent() -> tuple[str, str, str]:
    trace, span = os.urandom(16).hex(), os.urandom(8).hex()
    return f"00-{trace}-{span}-01", trace, span


def _spans(receiver: OtlpReceiver, trace: str, count: int) -> dict[str, list[dict]]:
    wait_for(lambda: len(receiver.of_trace(trace)) >= count, 30, f"{count} spans of trace {trace}")
    by_name: dict[str, list[dict]] = {}
    for span in receiver.of_trace(trace):
        by_name.setdefault(span["name"], []).append(span)
    return by_name


def _x(module):
    x = module.InferInput("X", [2], "INT32")
    x.set_data_from_numpy(np.array([1, 2], np.int32))
    return [x]


def test_a_clients_trace_continues_through_models_ensembles_and_bls_calls(start_server, tmp_path, receiver):
    repo = tmp_path / "repo"
    write_model(repo, "step", STEP_PY.format(delta=1), 'backend: "python"\n' + IO)
    (repo / "pipeline" / "1").mkdir(parents=True)
    (repo / "pipeline" / "config.pbtxt").write_text(ENSEMBLE)
    write_model(repo, "caller", CALLER_PY, 'backend: "python"\n' + CALLER_IO)
    server = start_server([repo], *_otel_flags(receiver, "rate=1000", "opentelemetry,resource=service.name=checkout",
                                               "opentelemetry,resource=deployment.environment=test"))
    http = httpclient.InferenceServerClient(server.url)

    # a plain model over HTTP: InferRequest under the client's span, the model's span, compute
    parent, trace, client_span = _traceparent()
    assert http.infer("step", _x(httpclient), headers={"traceparent": parent}).as_numpy("Y").tolist() == [2, 3]
    spans = _spans(receiver, trace, 3)
    (top,), (model,), (compute,) = spans["InferRequest"], spans["step"], spans["compute"]
    assert top["parent"] == client_span and model["parent"] == top["id"] and compute["parent"] == model["id"]
    assert model["attributes"] == {"triton.model_name": "step", "triton.model_version": 1,
                                   "triton.trace_id": model["attributes"]["triton.trace_id"],
                                   "triton.trace_parent_id": 0}
    assert model["events"] == ["REQUEST_START", "QUEUE_START", "REQUEST_END"]
    assert compute["events"] == ["COMPUTE_START", "COMPUTE_INPUT_END", "COMPUTE_OUTPUT_START", "COMPUTE_END"]
    assert {s["kind"] for s in receiver.of_trace(trace)} == {2}  # SERVER, as Triton's
    assert top["scope"] == "triton-server" and top["content_type"] == "application/x-protobuf"
    assert top["resource"]["service.name"] == "checkout" and top["resource"]["deployment.environment"] == "test"

    # an ensemble over gRPC: its step's model span under the ensemble's
    parent, trace, client_span = _traceparent()
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    assert grpc.infer("pipeline", _x(grpcclient), headers={"traceparent": parent}).as_numpy("Y").tolist() == [2, 3]
    spans = _spans(receiver, trace, 4)
    (top,), (ensemble,), (step,), (compute,) = spans["InferRequest"], spans["pipeline"], spans["step"], spans["compute"]
    assert top["parent"] == client_span and ensemble["parent"] == top["id"]
    assert step["parent"] == ensemble["id"] and compute["parent"] == step["id"]
    assert step["attributes"]["triton.trace_parent_id"] == ensemble["attributes"]["triton.trace_id"]

    # a python model's BLS call made with its request's trace: under the caller's span; the caller
    # reads its own span's context
    parent, trace, client_span = _traceparent()
    result = http.infer("caller", _x(httpclient), headers={"traceparent": parent})
    assert result.as_numpy("Y").tolist() == [2, 3]
    spans = _spans(receiver, trace, 5)
    (top,), (caller,), (step,) = spans["InferRequest"], spans["caller"], spans["step"]
    assert top["parent"] == client_span and caller["parent"] == top["id"] and step["parent"] == caller["id"]
    assert len(spans["compute"]) == 2
    context = json.loads(result.as_numpy("CTX")[0])
    assert context["traceparent"] == f"00-{trace}-{caller['id']}-01"

    status, _, body = server.get("/v2/trace/setting")
    assert status == 200 and orjson.loads(body) == {
        "trace_level": ["TIMESTAMPS"], "trace_rate": "1000", "trace_count": "-1", "trace_mode": "opentelemetry",
        "url": receiver.url, "resource": "service.name=checkout,deployment.environment=test",
        "bsp_max_queue_size": "2048", "bsp_schedule_delay": "50", "bsp_max_export_batch_size": "512"}
    status, _, body = server.post("/v2/trace/setting", b'{"url": "elsewhere:4318"}')
    assert status == 501 and b"can not be updated through network protocol" in body  # Triton ignores it
    assert scrape_metrics(server)["tritonmp_trace_spans_dropped_total"] == 0


@pytest.mark.slow
def test_spans_a_receiver_cannot_take_are_dropped_and_counted_not_waited_for(start_server, tmp_path, receiver):
    repo = tmp_path / "repo"
    write_model(repo, "step", STEP_PY.format(delta=1), 'backend: "python"\n' + IO)
    receiver.close()  # nothing listens there: every export fails
    server = start_server([repo], *_otel_flags(receiver, "rate=1", "opentelemetry,bsp_max_queue_size=4",
                                               "opentelemetry,bsp_max_export_batch_size=2"))
    http = httpclient.InferenceServerClient(server.url)
    started = time.monotonic()
    for _ in range(10):  # answered at once: the export, retrying for seconds, never holds a request
        assert http.infer("step", _x(httpclient)).as_numpy("Y").tolist() == [2, 3]
    assert time.monotonic() - started < 5
    # 30 spans: those past the queue's 4 are dropped as they end, the rest once their export has failed
    server.wait_until(lambda: scrape_metrics(server)["tritonmp_trace_spans_dropped_total"] >= 26, 10,
                      "the spans past the queue counted as dropped")
