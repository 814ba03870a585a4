"""--metrics-config as Triton reads it: the duration counters off (counter_latencies=false), the
latency summaries on (summary_latencies, summary_quantiles, summary_max_age), the time-to-first-
response histogram (histogram_latencies, a config's model_metrics buckets), and the response
cache's families for the models whose config enables it; a setting this server does not know
stops it at start, in words."""

from __future__ import annotations

import math
import queue
import subprocess
import sys

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.grpc import model_config_pb2 as mc

from tritonmp.metrics_config import DEFAULT_QUANTILES, MetricsConfigError, parse_metrics_config
from tritonmp.observability.latency_metrics import Summary, first_response_buckets

from conftest import ROOT, X_TO_Y_CONFIG, scrape_metrics, write_model

ECHO_PY = ("import triton_python_backend_utils as pb_utils\n\nclass TritonPythonModel:\n"
           "    def execute(self, requests):\n        return [pb_utils.InferenceResponse([pb_utils.Tensor('Y', "
           "pb_utils.get_input_tensor_by_name(r, 'X').as_numpy())]) for r in requests]\n")
TWICE_PY = """import time
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        for r in requests:
            sender = r.get_response_sender()
            x = pb_utils.get_input_tensor_by_name(r, "X").as_numpy()
            time.sleep(0.05)
            sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("Y", x)]))
            time.sleep(0.3)
            sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("Y", x)]),
                        flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""
BUCKETS = ('model_metrics { metric_control [ { metric_identifier { '
           'family: "nv_inference_first_response_histogram_ms" } '
           'histogram_options { buckets: [ -1, 0.0, 1, 2.5, 100, 1000 ] } } ] }\n')


def test_settings_are_read_as_triton_reads_them_and_unknown_ones_refused():
    assert parse_metrics_config({}).summary_quantiles == DEFAULT_QUANTILES
    config = parse_metrics_config({"counter_latencies": "false", "summary_latencies": "TRUE",
                                   "summary_quantiles": "0.1:0.0.1,0.7:0.01", "summary_max_age": "5",
                                   "histogram_latencies": "true"})
    assert (config.counter_latencies, config.summary_latencies, config.histogram_latencies) == (False, True, True)
    assert config.summary_quantiles == ((0.1, 0.0), (0.7, 0.01)) and config.summary_max_age == 5
    for bad, words in (({"summary": "true"}, "unknown --metrics-config setting 'summary'"),
                       ({"summary_latencies": "maybe"}, "must be true or false"),
                       ({"summary_quantiles": "x"}, "must be <quantile>:<error>"),
                       ({"summary_quantiles": "2:0.1"}, "between 0 and 1"),
                       ({"summary_max_age": "0"}, "above 0")):
        with pytest.raises(MetricsConfigError, match=words):
            parse_metrics_config(bad)


def test_a_summary_reads_its_quantiles_from_its_window_and_counts_everything():
    summary = Summary(max_age=10)
    for i, value in enumerate(range(1, 101)):
        summary.observe(value, now=float(i) / 10)  # 100 values over 10 s
    assert summary.quantiles(((0.5, 0.05), (0.99, 0.001)), now=10) == [50, 99]
    assert summary.quantiles(((0.5, 0.05),), now=15) == [75]  # the first half has aged out
    assert math.isnan(summary.quantiles(((0.5, 0.05),), now=100)[0])
    assert (summary.count, summary.total) == (100, 5050)  # count and sum are of every value


def test_a_configs_model_metrics_sets_the_first_response_buckets():
    config = mc.ModelConfig()
    assert first_response_buckets(config) == (100, 500, 2000, 5000)
    control = config.model_metrics.metric_control.add()
    control.metric_identifier.family = "nv_inference_first_response_histogram_ms"
    control.histogram_options.buckets.extend([2.5, -1, 0])
    assert first_response_buckets(config) == (-1, 0, 2.5)


def _stream_twice(server, n: int) -> None:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    got: queue.Queue = queue.Queue()
    client.start_stream(lambda result, error: got.put(error or result))
    x = grpcclient.InferInput("X", [1], "FP32")
    x.set_data_from_numpy(np.ones(1, np.float32))
    for _ in range(n):
        client.async_stream_infer("twice", [x])
    for _ in range(2 * n):
        assert not isinstance(got.get(timeout=30), Exception)
    client.stop_stream()


def test_summaries_histograms_and_cache_families_as_configured(start_server, tmp_path):
    repo = tmp_path / "repo"
    write_model(repo, "echo", ECHO_PY, X_TO_Y_CONFIG)
    write_model(repo, "cached", ECHO_PY, X_TO_Y_CONFIG + "response_cache { enable: true }\n")
    write_model(repo, "twice", TWICE_PY, X_TO_Y_CONFIG + "model_transaction_policy { decoupled: true }\n" + BUCKETS)
    server = start_server([repo], "--cache-config=local,size=1048576", "--metrics-config=counter_latencies=false",
                          "--metrics-config=summary_latencies=true", "--metrics-config=histogram_latencies=true",
                          "--metrics-config=summary_quantiles=0.5:0.05,0.9:0.01")
    client = httpclient.InferenceServerClient(server.url)
    x = httpclient.InferInput("X", [1], "FP32")
    x.set_data_from_numpy(np.ones(1, np.float32))
    for _ in range(3):
        client.infer("echo", [x])
        client.infer("cached", [x])  # one miss, then hits
    _stream_twice(server, 2)
    m = scrape_metrics(server)

    def labels(model: str) -> str:
        return f'model="{model}",version="1"'

    assert not any(k.startswith("nv_inference_request_duration_us") for k in m), "counter_latencies=false"
    assert m[f"nv_inference_queue_summary_us_count{{{labels('echo')}}}"] == 3
    assert {k for k in m if k.startswith(f"nv_inference_request_summary_us{{{labels('echo')}")} == {
        f'nv_inference_request_summary_us{{{labels("echo")},quantile="{q}"}}' for q in ("0.5", "0.9")}
    # a model whose responses may come from the cache keeps no request summary, as in Triton
    assert f"nv_inference_request_summary_us_count{{{labels('cached')}}}" not in m
    assert m[f"nv_cache_num_hits_per_model{{{labels('cached')}}}"] == 2
    assert m[f"nv_cache_num_misses_per_model{{{labels('cached')}}}"] == 1
    assert m[f"nv_cache_hit_summary_per_model_count{{{labels('cached')}}}"] == 2
    assert f"nv_cache_num_hits_per_model{{{labels('echo')}}}" not in m  # only where the config enables it
    # the decoupled model's first responses (about 50 ms each), not its last (about 350 ms)
    first = "nv_inference_first_response_histogram_ms"
    assert m[f"{first}_count{{{labels('twice')}}}"] == 2
    assert 100 <= m[f"{first}_sum{{{labels('twice')}}}"] < 600
    assert m[f'{first}_bucket{{{labels("twice")},le="1000"}}'] == 2
    assert m[f'{first}_bucket{{{labels("twice")},le="2.5"}}'] == 0
    assert [k for k in m if k.startswith(f"{first}_bucket{{{labels('twice')}")] == [
        f'{first}_bucket{{{labels("twice")},le="{le}"}}' for le in ("-1", "0", "1", "2.5", "100", "1000", "+Inf")]
    assert m[f"{first}_count{{{labels('echo')}}}"] == 3  # one response each: the first


def test_an_unknown_setting_stops_the_server_at_start(tmp_path):
    result = subprocess.run([sys.executable, "-m", "tritonmp", "--model-repository", str(ROOT / "configs"),
                             "--metrics-config=summary=true"], capture_output=True, text=True, timeout=60)
    assert result.returncode != 0
    assert "unknown --metrics-config setting 'summary'" in result.stdout + result.stderr
