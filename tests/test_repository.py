"""The repository API and model control: index, load (with a config override and with files),
unload, reload under traffic without a failed request, polling, and names that stay inside."""

import base64
import json
import shutil
import threading
import time

import numpy as np
import orjson
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tritonmp.errors import ServerError

from conftest import X_TO_Y_CONFIG, infer_add, scrape_metrics, write_model
from make_example_repo import binary_op_model

ADD_PY_CONFIG = {
    "backend": "python", "max_batch_size": 8,
    "input": [{"name": "A", "data_type": "TYPE_FP32", "dims": [3]},
              {"name": "B", "data_type": "TYPE_FP32", "dims": [3]}],
    "output": [{"name": "C", "data_type": "TYPE_FP32", "dims": [3]}],
    "instance_group": [{"kind": "KIND_CPU", "count": 1}],
}


def _config(**changes):
    return json.dumps({**ADD_PY_CONFIG, **changes})


def _add(client, model="add_py", rows=1):
    return infer_add(client, model, np.full((rows, 3), 2.0, np.float32))


@pytest.fixture
def explicit(start_server, example_repo):
    return start_server([example_repo], "--model-control-mode=explicit", "--load-model", "add")


def test_explicit_mode_loads_only_what_is_named(explicit):
    client = httpclient.InferenceServerClient(explicit.url)
    assert client.get_model_repository_index() == [{"name": "add", "version": "1", "state": "READY"},
                                                   {"name": "add_py"}]
    assert client.get_model_repository_index() and not client.is_model_ready("add_py")
    status, _, raw = explicit.post("/v2/repository/index", orjson.dumps({"ready": True}))
    assert orjson.loads(raw) == [{"name": "add", "version": "1", "state": "READY"}]
    status, _, raw = explicit.post("/v2/repository/index", orjson.dumps({"ready": "yes"}))
    assert (status, orjson.loads(raw)) == (400, {"error": "attempt to access JSON non-boolean as boolean"})


def test_load_and_unload_over_http_and_grpc(explicit):
    client = httpclient.InferenceServerClient(explicit.url)
    client.load_model("add_py")
    assert client.is_model_ready("add_py")
    np.testing.assert_array_equal(_add(client), np.full((1, 3), 4.0))
    client.unload_model("add_py")
    explicit.wait_until(lambda: {"name": "add_py", "version": "1", "state": "UNAVAILABLE", "reason": "unloaded"}
                        in client.get_model_repository_index(), what="unload")
    assert not client.is_model_ready("add_py")
    _refused_as_triton_refuses(explicit, "add_py")
    # unloaded on purpose: not a model version the not-ready alert should fire for
    assert not [k for k in scrape_metrics(explicit) if k.startswith('tritonmp_model_ready{model="add_py"')]
    g = grpcclient.InferenceServerClient(explicit.grpc_url)
    g.load_model("add_py")
    assert g.is_model_ready("add_py")
    index = g.get_model_repository_index(as_json=True)["models"]
    assert {"name": "add_py", "version": "1", "state": "READY"} in index
    g.unload_model("add_py", unload_dependents=True)
    assert not g.is_model_ready("add_py")


def _refused_as_triton_refuses(server, model):
    """A model whose version 1 is known but not served (unloaded, or its load failed): without a
    version it has none available (404), its version 1 is not ready (503), on both protocols, and
    a request's body is not read to say so."""
    for path in (f"/v2/models/{model}/infer", f"/v2/models/{model}"):
        status, _, raw = server.post(path, b"{") if path.endswith("infer") else server.get(path)
        assert (status, orjson.loads(raw)) == (404, {"error": f"Request for unknown model: '{model}' has no "
                                                              "available versions"}), path
    for path in (f"/v2/models/{model}/versions/1/infer", f"/v2/models/{model}/versions/1/config"):
        status, _, raw = server.post(path, b"{") if path.endswith("infer") else server.get(path)
        assert (status, orjson.loads(raw)) == (503, {"error": f"Request for unknown model: '{model}' version 1 "
                                                              "is not at ready state"}), path
    g = grpcclient.InferenceServerClient(server.grpc_url)
    for version, code in (("", "StatusCode.NOT_FOUND"), ("1", "StatusCode.UNAVAILABLE")):
        with pytest.raises(InferenceServerException) as e:
            g.get_model_metadata(model, version)
        assert e.value.status() == code, version


def test_load_with_a_config_override(explicit):
    client = httpclient.InferenceServerClient(explicit.url)
    client.load_model("add_py", config=_config(max_batch_size=4))
    assert client.get_model_config("add_py")["max_batch_size"] == 4
    with pytest.raises(InferenceServerException, match="batch-size must be <= 4"):
        _add(client, rows=5)


def test_load_with_files_runs_from_a_private_directory(explicit, tmp_path):
    client = httpclient.InferenceServerClient(explicit.url)
    onnx_bytes = binary_op_model("Mul").SerializeToString()
    config = json.dumps({"platform": "onnxruntime_onnx", "max_batch_size": 8})
    client.load_model("uploaded", config=config, files={"file:1/model.onnx": onnx_bytes})
    np.testing.assert_array_equal(_add(client, "uploaded"), np.full((1, 3), 4.0))
    g = grpcclient.InferenceServerClient(explicit.grpc_url)
    g.load_model("uploaded_grpc", config=config, files={"file:1/model.onnx": onnx_bytes})
    assert g.is_model_ready("uploaded_grpc")
    # a leading slash names the same file, as Triton takes it
    client.load_model("slashed", config=config, files={"file:/1/model.onnx": onnx_bytes})
    assert client.is_model_ready("slashed")
    for bad in ("file:../1/model.onnx", "file:/../1/model.onnx", "file:1/../../model.onnx"):
        status, _, raw = explicit.post("/v2/repository/models/escape/load", orjson.dumps(
            {"parameters": {"config": config, bad: base64.b64encode(onnx_bytes).decode()}}))
        # Triton's status and words (its repository agent's error is a failed poll), the reason after them
        assert status == 500, raw
        message = orjson.loads(raw)["error"]
        assert message.startswith("failed to load 'escape', failed to poll from model repository: ")
        assert "must stay inside the model directory" in message
    status, _, raw = explicit.post("/v2/repository/models/long/load", orjson.dumps(
        {"parameters": {"config": config, "file:1/" + "m" * 300: base64.b64encode(b"x").decode()}}))
    assert status == 500 and "File name too long" in orjson.loads(raw)["error"]
    assert "/tmp" not in orjson.loads(raw)["error"]  # no path of the server's disk
    # a path component past NAME_MAX over gRPC, as Triton's simple_grpc_model_control.py sends it
    with pytest.raises(InferenceServerException) as e:
        g.load_model("uploaded_grpc", config="{}", files={"file:" + "A" * 256: b"a"})
    assert e.value.status() == "StatusCode.INTERNAL"
    assert "failed to poll from model repository" in e.value.message()
    assert g.is_server_live() and g.is_model_ready("uploaded_grpc")


def test_failed_load_keeps_the_previous_version_serving(explicit):
    client = httpclient.InferenceServerClient(explicit.url)
    client.load_model("add_py")
    bad = _config(output=[{"name": "C", "data_type": "TYPE_FP32", "dims": [-3]}])
    with pytest.raises(InferenceServerException) as e:
        client.load_model("add_py", config=bad)
    assert e.value.message().startswith("failed to load 'add_py', load failed for model 'add_py'")
    assert "output[0].dims: [-3]" in e.value.message()
    assert client.is_model_ready("add_py")
    np.testing.assert_array_equal(_add(client), np.full((1, 3), 4.0))
    (row,) = [r for r in client.get_model_repository_index() if r["name"] == "add_py"]
    assert row["state"] == "READY" and "a later load failed" in row["reason"]


def test_unknown_and_escaping_names_are_refused(explicit):
    client = httpclient.InferenceServerClient(explicit.url)
    for c in (client, grpcclient.InferenceServerClient(explicit.grpc_url)):
        with pytest.raises(InferenceServerException) as e:
            c.load_model("nope")
        assert e.value.message().startswith("failed to load 'nope', failed to poll from model repository")
        assert "/" not in e.value.message()  # no path of the server's file system
    g = grpcclient.InferenceServerClient(explicit.grpc_url)
    for name, message in (("..", "must not contain path traversal characters"),
                          ("../model_repository", "must not contain path traversal characters"),
                          (" ", "Model name cannot be empty"), (".hidden", "not a valid model name")):
        with pytest.raises(InferenceServerException, match=message):
            g.load_model(name)


def test_reload_under_traffic_loses_no_request(explicit):
    client = httpclient.InferenceServerClient(explicit.url)
    client.load_model("add_py")
    stop, failures, done = threading.Event(), [], [0]

    def traffic():
        c = httpclient.InferenceServerClient(explicit.url)
        while not stop.is_set():
            try:
                np.testing.assert_array_equal(_add(c), np.full((1, 3), 4.0))
                done[0] += 1
            except Exception as e:  # every request must succeed
                failures.append(e)
        c.close()  # in this thread, not in the collector's

    threads = [threading.Thread(target=traffic) for _ in range(4)]
    for t in threads:
        t.start()
    try:
        for i in range(3):
            explicit.wait_until(lambda n=done[0]: done[0] > n + 20, what="traffic")
            client.load_model("add_py", config=_config(dynamic_batching={"max_queue_delay_microseconds": 1000 * i}))
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert not failures, failures[:3]
    assert done[0] > 60


SLOW_COMPLETION_PY = """
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    @staticmethod
    def auto_complete_config(config):
        time.sleep(2)
        return config

    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("Y", pb_utils.get_input_tensor_by_name(r, "X").as_numpy())])
                for r in requests]
"""


def test_a_slow_config_completion_does_not_stop_the_server(start_server, example_repo, tmp_path):
    """A model whose auto_complete_config takes 2 s loads while the server answers every other request
    at once: a config is completed off the event loop."""
    write_model(tmp_path / "repo", "slow_config", SLOW_COMPLETION_PY, X_TO_Y_CONFIG)
    server = start_server([example_repo, tmp_path / "repo"], "--model-control-mode=explicit", "--load-model", "add")
    client = httpclient.InferenceServerClient(server.url)
    loading = threading.Thread(target=lambda: httpclient.InferenceServerClient(server.url).load_model("slow_config"))
    started = time.monotonic()
    loading.start()
    slowest = 0.0
    while loading.is_alive() and time.monotonic() - started < 30:
        asked = time.monotonic()
        assert client.is_server_live()
        assert _add(client, "add")[0, 0] == 4.0
        slowest = max(slowest, time.monotonic() - asked)
    loading.join(30)
    assert time.monotonic() - started >= 2, "the load overlapped the requests"
    assert client.is_model_ready("slow_config")
    assert slowest < 0.5, f"a request waited {slowest:.2f}s for the load"


def test_load_is_refused_outside_explicit_mode(server):
    with pytest.raises(InferenceServerException) as e:
        httpclient.InferenceServerClient(server.url).load_model("add")
    assert "explicit model load / unload is not allowed" in e.value.message()
    assert "--model-control-mode=explicit" in e.value.message()


def test_poll_mode_follows_the_repository(start_server, example_repo, tmp_path):
    repo = tmp_path / "repo"
    shutil.copytree(example_repo / "add", repo / "add")
    server = start_server([repo], "--model-control-mode=poll", "--repository-poll-secs", "0.2")
    client = httpclient.InferenceServerClient(server.url)
    shutil.copytree(example_repo / "add_py", repo / "add_py")
    server.wait_until(lambda: client.is_model_ready("add_py"), what="the new model")
    config = (repo / "add_py" / "config.pbtxt").read_text().replace("max_batch_size: 8", "max_batch_size: 2")
    (repo / "add_py" / "config.pbtxt").write_text(config)
    server.wait_until(lambda: client.get_model_config("add_py")["max_batch_size"] == 2, what="the reload")
    shutil.rmtree(repo / "add_py")
    server.wait_until(lambda: not client.is_model_ready("add_py"), what="the unload")
    assert client.is_model_ready("add")


def test_a_model_that_fails_to_initialize_reports_why(start_server, tmp_path):
    write_model(tmp_path / "repo", "broken", "class TritonPythonModel:\n    def initialize(self, args):\n"
                "        raise RuntimeError('no weights here')\n", X_TO_Y_CONFIG)
    server = start_server([tmp_path / "repo"], "--model-control-mode=explicit")
    client = httpclient.InferenceServerClient(server.url)
    with pytest.raises(InferenceServerException) as e:
        client.load_model("broken")
    message = e.value.message()
    assert message.startswith("failed to load 'broken', load failed for model 'broken': version 1 is at UNAVAILABLE")
    assert "RuntimeError: no weights here" in message
    assert 'File "broken/1/model.py", line 3, in initialize' in message  # from the repository, not the disk
    assert str(tmp_path) not in message and "python_backend.py" not in message
    (row,) = client.get_model_repository_index()
    assert row["version"] == "1" and row["state"] == "UNAVAILABLE" and "no weights here" in row["reason"]
    assert row["reason"].startswith("failed to load 'broken', ") and str(tmp_path) not in row["reason"]
    _refused_as_triton_refuses(server, "broken")
    ready = {k: v for k, v in scrape_metrics(server).items() if k.startswith("tritonmp_model_ready")}
    assert ready == {'tritonmp_model_ready{model="broken",version=""}': 0}  # what the not-ready alert sees


def test_model_versions_are_read_as_stol_reads_them():
    from tritonmp.lifecycle.model_manager import parse_version

    read = {"": -1, "1": 1, "007": 7, " \t1": 1, "+2": 2, "-0": 0, "3abc": 3, "1.5": 1, "0x10": 0,
            str(2**63 - 1): 2**63 - 1}
    for text, number in read.items():
        assert parse_version(text) == number, text
        assert parse_version(text) == number, text  # kept
    for text in ("abc", " ", "+", "٣", str(2**63), str(-2**63 - 1), "_1"):
        with pytest.raises(ServerError) as e:
            parse_version(text)
        assert e.value.message == (f"failed to get model version from specified version string '{text}' "
                                   "(details: stol), version should be an integral value > 0")
    with pytest.raises(ServerError) as e:
        parse_version("-3")
    assert e.value.message == "invalid model version specified '-3' , version should be an integral value > 0"
