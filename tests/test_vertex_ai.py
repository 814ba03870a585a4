"""Google Vertex AI's endpoint: AIP_MODE=PREDICTION turns it on (HTTP and gRPC off) on AIP_HTTP_PORT with
the repository AIP_STORAGE_URI, here a bucket of a real S3-compatible server; the health route, the
predict route to the default model in JSON and binary, the redirect header to Triton's other routes;
a default model that is not loaded stops the server. tests/test_compat.py compares the answers with
Triton's."""

from __future__ import annotations

import json
import shutil
import struct
import subprocess

import numpy as np
import pytest

from conftest import EXAMPLE_REPO, TRITONMP, free_port, http_request

BINARY = "application/vnd.vertex-ai-triton.binary+json;json-header-size="
ADD = {"inputs": [{"name": "A", "shape": [1, 3], "datatype": "FP32", "data": [1, 2, 3]},
                  {"name": "B", "shape": [1, 3], "datatype": "FP32", "data": [1, 1, 1]}]}
REDIRECT = "X-Vertex-Ai-Triton-Redirect"


def vertex_env(port: int, **more: str) -> dict[str, str]:
    return {"AIP_MODE": "PREDICTION", "AIP_HTTP_PORT": str(port), "AIP_HEALTH_ROUTE": "/health",
            "AIP_PREDICT_ROUTE": "/predict", **more}


def vertex_repo(root):
    repo = root / "repo"
    repo.mkdir()
    shutil.copytree(EXAMPLE_REPO / "add_py", repo / "add_py")
    return repo


def test_a_vertex_ai_container_serves_its_storage_uri_on_its_routes(start_server, tmp_path):
    port = free_port()
    server = start_server([], wait=False, env=vertex_env(port, AIP_STORAGE_URI=str(vertex_repo(tmp_path))))
    server.wait_until(lambda: http_request(port, "GET", "/health")[0] == 200, what="the health route")
    log = server.log()
    assert "Started Vertex AI HTTPService" in log and "Started HTTPService" not in log and "GRPC" not in log, log
    status, headers, body = http_request(port, "POST", "/predict", json.dumps(ADD).encode())
    assert status == 200 and json.loads(body)["outputs"][0]["data"] == [2.0, 3.0, 4.0], body
    header = json.dumps({"inputs": [{"name": n, "shape": [1, 3], "datatype": "FP32",
                                     "parameters": {"binary_data_size": 12}} for n in "AB"],
                         "outputs": [{"name": "C", "parameters": {"binary_data": True}}]}).encode()
    payload = header + np.array([1, 2, 3], np.float32).tobytes() + np.ones(3, np.float32).tobytes()
    status, headers, body = http_request(port, "POST", "/predict", payload, {"Content-Type": f"{BINARY}{len(header)}"})
    assert status == 200 and headers["content-type"] == "application/octet-stream", headers
    length = int(headers["inference-header-content-length"])
    assert struct.unpack("3f", body[length:]) == (2.0, 3.0, 4.0)
    for route, method, want in (("v2/models/add_py/ready", "POST", 200), ("v2/models/add_py/ready", "GET", 405),
                                ("v2/logging", "POST", 400), ("v2/health/live", "POST", 200),
                                ("v2/models/nope/infer", "POST", 404)):
        status, _, body = http_request(port, method, "/predict", b"{}" if "infer" in route else None,
                                       {REDIRECT: route})
        assert status == want, (route, method, status, body)
    status, _, body = http_request(port, "POST", "/predict", json.dumps(ADD).encode(),
                                   {REDIRECT: "v2/models/add_py/versions/1/infer"})
    assert status == 200 and json.loads(body)["model_version"] == "1", body
    status, _, body = http_request(port, "POST", "/predict", None, {REDIRECT: "metrics"})
    assert status == 200 and b'nv_inference_request_success{model="add_py",version="1"} 3' in body, body
    status, _, body = http_request(port, "POST", "/predict", None, {REDIRECT: "v2/models/add_py/config"})
    assert status == 200 and json.loads(body)["name"] == "add_py"
    assert http_request(port, "GET", "/other")[0] == 400


@pytest.mark.parametrize("env, words", [
    ({"AIP_PREDICT_ROUTE": ""}, "API_PREDICT_ROUTE is not defined for Vertex AI endpoint"),
    ({"VERTEX_DEFAULT": "nope"}, "Expect the default model 'nope' is loaded"),
    ({"SECOND_MODEL": "1"}, "Expect the model repository contains only a single model if default model is not "
                            "specified"),
])
def test_a_vertex_ai_endpoint_that_cannot_serve_as_told_stops_the_server(tmp_path, env, words):
    import os

    repo = vertex_repo(tmp_path)
    if env.pop("SECOND_MODEL", ""):
        shutil.copytree(EXAMPLE_REPO / "add_py", repo / "add_py_2")
        config = repo / "add_py_2" / "config.pbtxt"
        config.write_text(config.read_text().replace('name: "add_py"', 'name: "add_py_2"'))
    flags = [f"--vertex-ai-default-model={env.pop('VERTEX_DEFAULT')}"] if "VERTEX_DEFAULT" in env else []
    done = subprocess.run([*TRITONMP, "--model-repository", str(repo), f"--metrics-port={free_port()}", *flags],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, **vertex_env(free_port()), **env})
    assert done.returncode == 1 and words in done.stdout + done.stderr, done.stdout + done.stderr


def test_the_bucket_a_vertex_ai_container_names_is_its_repository(tmp_path, start_server):
    """AIP_STORAGE_URI a gs:// bucket, as Vertex AI gives it, served through item 1's object storage."""
    import object_stores

    why = object_stores.missing("gs")
    if why:
        pytest.skip(why)
    store = object_stores.start("gs", tmp_path)
    try:
        store.upload(vertex_repo(tmp_path), "vertex")
        port = free_port()
        env = {**store.env, **vertex_env(port, AIP_STORAGE_URI=store.uri("vertex"))}
        server = start_server([], wait=False, env=env)
        server.wait_until(lambda: http_request(port, "GET", "/health")[0] == 200, what="the health route")
        status, _, body = http_request(port, "POST", "/predict", json.dumps(ADD).encode())
        assert status == 200 and json.loads(body)["outputs"][0]["data"] == [2.0, 3.0, 4.0], body
    finally:
        store.close()
