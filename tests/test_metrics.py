"""The Prometheus endpoint: Triton's metric names and labels, and tritonmp's extras, moving under
traffic, crashes and failures."""

import http.client
import os
import re

import orjson
import pytest

from tritonmp.gpus import visible_gpus

from conftest import http_request
from conftest import scrape_metrics as _scrape


def _x(value, rows=1):
    return orjson.dumps({"inputs": [{"name": "X", "shape": [rows, 4], "datatype": "FP32", "data": [value] * 4 * rows}]})


def test_every_triton_metric_is_present_and_moves(server):
    before = _scrape(server)
    for rows in (1, 2, 3):
        assert server.post("/v2/models/batch_report/infer", _x(1.0, rows))[0] == 200
    after = _scrape(server)
    labels = '{model="batch_report",version="1"}'
    assert after["nv_inference_request_success" + labels] == before["nv_inference_request_success" + labels] + 3
    assert after["nv_inference_count" + labels] == before["nv_inference_count" + labels] + 6
    assert after["nv_inference_exec_count" + labels] >= before["nv_inference_exec_count" + labels] + 1
    for name in ("request", "queue", "compute_input", "compute_infer", "compute_output"):
        key = f"nv_inference_{name}_duration_us" + labels
        assert after[key] > before[key], name
    assert after["nv_inference_pending_request_count" + labels] == 0
    for reason in ("OTHER", "BACKEND", "CANCELED", "REJECTED"):
        assert f'nv_inference_request_failure{{model="batch_report",reason="{reason}",version="1"}}' in after
    assert 0.0 <= after["nv_cpu_utilization"] <= 1.0
    assert after["nv_cpu_memory_total_bytes"] >= after["nv_cpu_memory_used_bytes"] > 0


def test_histograms_and_extras(server):
    before = _scrape(server)
    assert server.post("/v2/models/batch_report/infer", _x(2.0, rows=3))[0] == 200
    after = _scrape(server)
    labels = 'model="batch_report",version="1"'
    assert after[f"tritonmp_batch_size_count{{{labels}}}"] >= before[f"tritonmp_batch_size_count{{{labels}}}"] + 1
    assert after[f'tritonmp_batch_size_bucket{{{labels},le="+Inf"}}'] == after[f"tritonmp_batch_size_count{{{labels}}}"]
    count = after[f"tritonmp_request_duration_us_count{{{labels}}}"]
    assert count == before[f"tritonmp_request_duration_us_count{{{labels}}}"] + 1
    buckets = [v for k, v in after.items() if k.startswith("tritonmp_request_duration_us_bucket") and labels in k]
    assert buckets == sorted(buckets)  # cumulative
    assert after[f"tritonmp_queue_depth{{{labels}}}"] == 0
    assert after[f"tritonmp_inflight_requests{{{labels}}}"] == 0
    assert after[f"tritonmp_model_load_duration_seconds{{{labels}}}"] > 0
    assert after[f"tritonmp_model_ready{{{labels}}}"] == 1
    queued = f"tritonmp_queue_duration_us_count{{{labels}}}"
    assert after[queued] >= before[queued] + 1
    assert after[f"tritonmp_worker_resident_memory_bytes{{instance=\"batch_report_0\",{labels}}}"] > 1 << 20
    assert after["process_resident_memory_bytes"] > 1 << 20 and after["process_cpu_seconds_total"] > 0


def test_failures_and_restarts_are_counted(server):
    before = _scrape(server)
    assert server.post("/v2/models/fail/infer", orjson.dumps(
        {"inputs": [{"name": "X", "shape": [1], "datatype": "FP32", "data": [0]}]}))[0] == 500
    assert server.post("/v2/models/crash/infer", orjson.dumps(
        {"inputs": [{"name": "X", "shape": [1], "datatype": "FP32", "data": [-1]}]}))[0] == 500
    assert server.post("/v2/models/crash/infer", orjson.dumps(
        {"inputs": [{"name": "X", "shape": [1], "datatype": "FP32", "data": [1]}]}))[0] == 200
    after = _scrape(server)
    key = 'nv_inference_request_failure{model="fail",reason="BACKEND",version="1"}'
    assert after[key] == before[key] + 1
    key = 'tritonmp_worker_restarts_total{model="crash",version="1"}'
    assert after[key] == before[key] + 1


def test_only_metrics_is_served_there(server):
    assert http_request(server.metrics_port, "GET", "/v2/health/live")[0] == 404


def test_metrics_can_be_turned_off(start_server, example_repo):
    server = start_server([example_repo], "--allow-cpu-metrics=false")
    samples = _scrape(server)
    assert not any(k.startswith("nv_cpu_") for k in samples)
    assert any(k.startswith("nv_inference_count") for k in samples)
    off = start_server([example_repo], "--allow-metrics=false", "--allow-grpc=false")
    with pytest.raises(OSError):
        conn = http.client.HTTPConnection("127.0.0.1", off.metrics_port, timeout=5)
        conn.request("GET", "/metrics")
        conn.getresponse()
    assert off.stop() == 0  # a server without some frontends still stops cleanly
    assert "Traceback" not in off.log()


def test_metric_names_follow_prometheus_rules(server):
    status, _, body = http_request(server.metrics_port, "GET", "/metrics")
    for line in body.decode().splitlines():
        if line.startswith("# TYPE"):
            assert re.fullmatch(r"# TYPE [a-zA-Z_:][a-zA-Z0-9_:]* (counter|gauge|histogram)", line), line


def test_each_family_is_one_group_under_its_own_header(server):
    """The text format wants every sample of a family together, after that family's HELP and TYPE;
    Prometheus and promtool refuse or misread a family whose samples come after another's header."""
    status, _, body = http_request(server.metrics_port, "GET", "/metrics")
    assert status == 200
    declared: list[str] = []
    samples = 0
    for line in body.decode().splitlines():
        if line.startswith("# TYPE "):
            family = line.split()[2]
            assert family not in declared, f"{family} is declared twice"
            declared.append(family)
        elif line and not line.startswith("#"):
            name = re.match(r"[a-zA-Z_:][a-zA-Z0-9_:]*", line).group(0)
            family = re.sub(r"_(bucket|count|sum)$", "", name) if declared and declared[-1] != name else name
            assert declared and family == declared[-1], f"{line!r} comes under {declared[-1] if declared else None}"
            samples += 1
    assert samples > 0 and "tritonmp_queue_depth" in declared and "tritonmp_worker_cpu_seconds_total" in declared


@pytest.mark.gpu
@pytest.mark.skipif(not visible_gpus() or os.environ.get("TRITONMP_FAKE_GPUS") is not None,
                    reason="no NVIDIA GPU visible on this machine")
def test_gpu_metrics_through_nvml(start_server, example_repo):
    pytest.importorskip("pynvml", reason="needs nvidia-ml-py (install tritonmp[gpu])")
    server = start_server([example_repo], "--metrics-interval-ms", "200")
    server.wait_until(lambda: any(k.startswith("nv_gpu_utilization") for k in _scrape(server)), what="GPU metrics")
    samples = _scrape(server)
    for name in ("nv_gpu_utilization", "nv_gpu_memory_total_bytes", "nv_gpu_memory_used_bytes", "nv_gpu_power_usage"):
        assert any(k.startswith(name + '{gpu_uuid="') for k in samples), name


def test_a_duration_counts_in_the_first_bucket_whose_bound_it_does_not_exceed():
    from tritonmp.observability.stats import LATENCY_BUCKETS_US, ModelStats

    def buckets(us: float) -> tuple[int, int, int]:
        """The bucket a request's duration lands in, as a success and as a failure, and its queue
        time's bucket (counted for the success only, as Triton counts queue time)."""
        stats = ModelStats("m", 1)
        stats.finished(True, 1, int(us * 1000), queue_ns=int(us * 1000))
        stats.finished(False, 1, int(us * 1000), queue_ns=int(us * 1000))
        assert sum(stats.latency_buckets) == 2 and sum(stats.queue_buckets) == 1
        latency = [i for i, n in enumerate(stats.latency_buckets) if n]
        assert len(latency) == 1 and stats.latency_buckets[latency[0]] == 2
        return latency[0], stats.queue_buckets.index(1)

    last = len(LATENCY_BUCKETS_US)
    assert buckets(0) == (0, 0)
    assert buckets(100) == (0, 0)  # on the bound: that bucket (Prometheus' le)
    assert buckets(100.5) == (1, 1)
    assert buckets(LATENCY_BUCKETS_US[-1]) == (last - 1, last - 1)
    assert buckets(LATENCY_BUCKETS_US[-1] + 1) == (last, last)  # +Inf
