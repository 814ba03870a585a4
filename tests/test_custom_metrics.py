"""Custom metrics of python models (pb_utils.MetricFamily / Metric), as Triton's documentation shows
them: exported on the metrics endpoint beside the server's own, read back with value(), misuse raised
in the model, kept across a worker's restart without counting twice, gone when the model unloads."""

import json

import pytest

from conftest import http_request, scrape_metrics, write_model

MODEL = """
import os

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.requests = pb_utils.MetricFamily(name="metered_requests", description="Requests the model saw",
                                              kind=pb_utils.MetricFamily.COUNTER)
        self.level = pb_utils.MetricFamily(name="metered_level", description="The last level asked for",
                                           kind=pb_utils.MetricFamily.GAUGE)
        self.sizes = pb_utils.MetricFamily(name="metered_sizes", description="Sizes seen",
                                           kind=pb_utils.MetricFamily.HISTOGRAM)
        labels = {"model": args["model_name"], "version": args["model_version"]}
        self.count = self.requests.Metric(labels=labels)
        self.gauge = self.level.Metric(labels=labels)
        self.histogram = self.sizes.Metric(labels=labels, buckets=[1.0, 10.0, 100.0])

    def execute(self, requests):
        responses = []
        for request in requests:
            op = pb_utils.get_input_tensor_by_name(request, "OP").as_numpy()[0].decode()
            if op == "crash":
                os._exit(1)
            self.count.increment(1)
            self.gauge.set(7.5)
            self.gauge.increment(-2)
            self.histogram.observe(5)
            if op == "misuse":
                answer = []
                for attempt in (lambda: self.count.increment(-1), lambda: self.count.set(3),
                                lambda: self.histogram.value(), lambda: self.gauge.observe(1),
                                lambda: self.sizes.Metric(labels={"a": "b"}),
                                lambda: pb_utils.MetricFamily(name="metered_requests", description="other",
                                                              kind=pb_utils.MetricFamily.GAUGE),
                                lambda: pb_utils.MetricFamily(name="nv_mine", description="x",
                                                              kind=pb_utils.MetricFamily.GAUGE)):
                    try:
                        attempt()
                        answer.append("no error")
                    except pb_utils.TritonModelException as e:
                        answer.append(str(e))
            elif op == "twice":  # Triton's qa: the same name and kind is the same family, whatever its description
                self.again = pb_utils.MetricFamily(name="metered_requests", description="another description",
                                                   kind=pb_utils.MetricFamily.COUNTER)
                same = self.again.Metric(labels={"model": "metered", "version": "1"})
                # kept, as a metric goes with its last reference
                self.unbounded = self.sizes.Metric(labels={"model": "metered", "version": "open"}, buckets=[])
                self.unbounded.observe(3)
                answer = [str(same.value() == self.count.value())]
            else:
                answer = [str(self.count.value()), str(self.gauge.value())]
            out = np.array(["\\n".join(answer).encode()], dtype=object)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", out)]))
        return responses
"""

CONFIG = """backend: "python"
max_batch_size: 0
input [ { name: "OP", data_type: TYPE_STRING, dims: [ 1 ] } ]
output [ { name: "OUT", data_type: TYPE_STRING, dims: [ 1 ] } ]
"""

LABELS = 'model="metered",version="1"'


@pytest.fixture
def metered(tmp_path, start_server):
    write_model(tmp_path / "repo", "metered", MODEL, CONFIG)
    return start_server([tmp_path / "repo"], "--model-control-mode=explicit", "--load-model=metered")


def _call(server, op):
    body = json.dumps({"inputs": [{"name": "OP", "datatype": "BYTES", "shape": [1], "data": [op]}]}).encode()
    status, _, data = server.post("/v2/models/metered/infer", body)
    return status, json.loads(data)


def _answer(server, op):
    status, data = _call(server, op)
    assert status == 200, data
    return data["outputs"][0]["data"][0].split("\n")


def test_counter_gauge_and_histogram_are_exported_and_read_back(metered):
    for n in range(1, 4):
        assert _answer(metered, "count") == [f"{float(n)}", "5.5"]
    samples = scrape_metrics(metered)
    assert samples[f"metered_requests{{{LABELS}}}"] == 3
    assert samples[f"metered_level{{{LABELS}}}"] == 5.5
    # bucket bounds and sums as Triton writes them: 1, not 1.0, and the bound after the labels
    assert samples[f'metered_sizes_bucket{{{LABELS},le="1"}}'] == 0
    assert samples[f'metered_sizes_bucket{{{LABELS},le="10"}}'] == 3
    assert samples[f"metered_sizes_count{{{LABELS}}}"] == 3
    assert samples[f"metered_sizes_sum{{{LABELS}}}"] == 15
    status, _, body = http_request(metered.metrics_port, "GET", "/metrics")
    assert "# HELP metered_requests Requests the model saw\n# TYPE metered_requests counter" in body.decode()


def test_a_family_asked_for_twice_and_a_histogram_of_no_buckets_are_tritons(metered):
    assert _answer(metered, "twice") == ["True"]
    samples = scrape_metrics(metered)
    assert samples['metered_sizes_bucket{model="metered",version="open",le="+Inf"}'] == 1
    assert samples['metered_sizes_sum{model="metered",version="open"}'] == 3
    status, _, body = http_request(metered.metrics_port, "GET", "/metrics")
    assert "# HELP metered_requests Requests the model saw\n" in body.decode()  # the first description stays


def test_misuse_raises_in_the_model_with_tritons_words(metered):
    assert _answer(metered, "misuse") == [
        "Failed to increment metric value: TRITONSERVER_METRIC_KIND_COUNTER can only be incremented by a "
        "non-negative value, got -1",
        "Failed to set metric value: TRITONSERVER_METRIC_KIND_COUNTER does not support Set",
        "Failed to get metric value: TRITONSERVER_METRIC_KIND_HISTOGRAM does not support Value",
        "Failed to observe metric value: TRITONSERVER_METRIC_KIND_GAUGE does not support Observe",
        "Error when creating Metric: a HISTOGRAM metric needs buckets",
        "Error when creating MetricFamily: a metric family 'metered_requests' already exists with kind COUNTER "
        "and description 'Requests the model saw'",
        "Error when creating MetricFamily: the names starting with nv_ or tritonmp_ belong to the server's own "
        "metrics ('nv_mine')",
    ]
    assert scrape_metrics(metered)[f"metered_requests{{{LABELS}}}"] == 1  # the misuse changed nothing


def test_values_survive_a_worker_restart_without_counting_twice(metered):
    for _ in range(2):
        _answer(metered, "count")
    status, _ = _call(metered, "crash")
    assert status == 500
    # the next request waits for the restarted worker, whose initialize() finds the counts it had
    assert _answer(metered, "count") == ["3.0", "5.5"]
    assert scrape_metrics(metered)[f"metered_requests{{{LABELS}}}"] == 3


def test_metrics_go_when_the_model_unloads(metered):
    _answer(metered, "count")
    assert f"metered_requests{{{LABELS}}}" in scrape_metrics(metered)
    assert metered.post("/v2/repository/models/metered/unload", b"{}")[0] == 200
    metered.wait_until(lambda: not any(k.startswith("metered_") for k in scrape_metrics(metered)), 30,
                       "the model's metrics to go")
    assert metered.post("/v2/repository/models/metered/load", b"{}")[0] == 200
    assert _answer(metered, "count") == ["1.0", "5.5"]  # a new load starts from zero
