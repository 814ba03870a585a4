"""The live status page on the metrics port, rendered by a real headless Chromium, and the
/status.json it reads: models and their states, instances, traffic that moves between two looks,
a crash-looping model shown UNAVAILABLE with its reason, shared-memory regions."""

import os
import re
import shutil
import subprocess

import numpy as np
import orjson
import pytest
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm

from conftest import http_request

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed (.ci/run installs it)")
ADD = orjson.dumps({"inputs": [{"name": "A", "shape": [1, 3], "datatype": "FP32", "data": [1, 2, 3]},
                               {"name": "B", "shape": [1, 3], "datatype": "FP32", "data": [1, 2, 3]}]})


def _render(server, tmp_path, screenshot=None, size=(1280, 1000)) -> str:
    """The page's DOM once its first status.json has been rendered (Chromium's virtual time runs
    the page's fetch and scripts to completion before the DOM is dumped)."""
    profile = tmp_path / f"chromium-{len(list(tmp_path.glob('chromium-*')))}"
    args = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync",
            f"--user-data-dir={profile}", f"--window-size={size[0]},{size[1]}", "--virtual-time-budget=5000"]
    args += [f"--screenshot={screenshot}"] if screenshot else ["--dump-dom"]
    done = subprocess.run([*args, f"http://127.0.0.1:{server.metrics_port}/"], capture_output=True, timeout=60)
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    return done.stdout.decode()


def _rows(dom: str) -> dict[str, str]:
    return dict(re.findall(r'<tr data-model="([^"]+)" data-namespace="[^"]*" data-version="[^"]*" '
                           r'data-state="([A-Z]+)"', dom))


def _served(dom: str) -> int:
    return int(re.search(r'id="total-requests" data-count="(\d+)"', dom).group(1))


def _status(server) -> dict:
    status, headers, body = http_request(server.metrics_port, "GET", "/status.json")
    assert status == 200 and headers["content-type"] == "application/json"
    return orjson.loads(body)


def test_status_json_describes_models_instances_traffic_and_settings(start_server, example_repo, test_repo):
    server = start_server([example_repo, test_repo], "--allow-client-shm=true", "--log-verbose", "0")
    for _ in range(20):
        assert server.post("/v2/models/add_py/infer", ADD)[0] == 200
    assert server.post("/v2/models/fail/infer", orjson.dumps(
        {"inputs": [{"name": "X", "shape": [1], "datatype": "FP32", "data": [0]}]}))[0] == 500
    doc = _status(server)
    assert doc["server"]["pid"] == server.pid and doc["server"]["ready"] is True
    assert doc["server"]["flags"]["--allow-client-shm"] is True
    assert str(test_repo) in doc["server"]["flags"]["--model-repository"]
    models = {m["name"]: m for m in doc["models"]}
    add = models["add_py"]
    assert add["state"] == "READY" and add["requests"]["success"] == 20 and add["batch_sizes"]
    (instance,) = add["instances"]
    assert instance["alive"] and os.path.exists(f"/proc/{instance['pid']}")
    assert add["window"]["p50_us"] > 0 and add["window"]["p99_us"] >= add["window"]["p50_us"]
    assert add["window"]["requests_per_s"] > 0
    assert models["fail"]["requests"]["failure_reasons"] == {"BACKEND": 1}
    assert doc["system"]["memory_total_bytes"] > 0
    # the rates come from samples of the same counters as the metrics
    metrics = http_request(server.metrics_port, "GET", "/metrics")[2].decode()
    assert 'nv_inference_request_success{model="add_py",version="1"} 20' in metrics
    assert http_request(server.metrics_port, "HEAD", "/")[0] == 200
    assert http_request(server.metrics_port, "POST", "/status.json", b"{}")[0] == 404


@pytest.mark.slow
@needs_chromium
def test_the_page_shows_live_traffic_a_crashed_model_and_regions(start_server, example_repo, test_repo, tmp_path):
    server = start_server([example_repo, test_repo], "--allow-client-shm=true", "--exit-on-error=false")
    for _ in range(10):
        assert server.post("/v2/models/add_py/infer", ADD)[0] == 200
    first = _render(server, tmp_path)
    rows = _rows(first)
    assert rows["add_py"] == "READY" and rows["crash"] == "READY" and "accumulate" in rows
    served = _served(first)
    assert served >= 10
    for _ in range(10):
        assert server.post("/v2/models/add_py/infer", ADD)[0] == 200
    key = f"/tritonmp-status-test-{os.getpid()}"
    handle = shm.create_shared_memory_region("status_region", key, 64)
    try:
        client = httpclient.InferenceServerClient(server.url)
        client.register_system_shared_memory("status_region", key, 64)
        # the crash model dies on a negative input; after five deaths in a minute it is given up
        crash = orjson.dumps({"inputs": [{"name": "X", "shape": [1], "datatype": "FP32", "data": [-1]}]})
        for _ in range(20):
            if server.get("/v2/models/crash/ready")[0] != 200 and _status_of(server, "crash") == "UNAVAILABLE":
                break
            server.wait_until(lambda: server.get("/v2/models/crash/ready")[0] == 200
                              or _status_of(server, "crash") == "UNAVAILABLE", timeout=30, what="a restart")
            server.post("/v2/models/crash/infer", crash)
        second = _render(server, tmp_path)
        client.unregister_system_shared_memory("status_region")
    finally:
        shm.destroy_shared_memory_region(handle)
    assert _served(second) >= served + 10  # the count grew between the two looks
    rows = _rows(second)
    assert rows["crash"] == "UNAVAILABLE" and rows["add_py"] == "READY"
    assert "died or failed to start 5 times" in second  # the reason, shown without a click
    assert 'data-region="status_region"' in second and key in second
    for size, name in (((1280, 1000), "desktop"), ((390, 844), "phone")):
        picture = tmp_path / f"status-{name}.png"
        _render(server, tmp_path, screenshot=picture, size=size)
        assert picture.stat().st_size > 10_000  # a page was drawn, not a blank
        assert picture.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _status_of(server, name: str) -> str:
    return next(m["state"] for m in _status(server)["models"] if m["name"] == name)


def test_the_page_goes_with_the_metrics(start_server, example_repo):
    server = start_server([example_repo], "--allow-metrics=false", "--allow-grpc=false")
    with pytest.raises(OSError):
        http_request(server.metrics_port, "GET", "/status.json")
    np.testing.assert_equal(server.get("/v2/health/ready")[0], 200)
