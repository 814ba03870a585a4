"""Statistics over HTTP and gRPC: Triton's shapes, counters that move with traffic."""

import numpy as np
import orjson
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from conftest import add_inputs

ZERO = {"count": 0, "ns": 0}


def _stats(server, path="/v2/models/add_py/stats"):
    status, _, raw = server.get(path)
    assert status == 200, raw
    return orjson.loads(raw)


def test_fresh_model_has_triton_shaped_zero_statistics(start_server, example_repo):
    server = start_server([example_repo])
    (entry,) = _stats(server)["model_stats"]
    assert entry == {"name": "add_py", "version": "1", "last_inference": 0, "inference_count": 0,
                     "execution_count": 0,
                     "inference_stats": {k: ZERO for k in ("success", "fail", "queue", "compute_input",
                                                           "compute_infer", "compute_output", "cache_hit",
                                                           "cache_miss")},
                     "response_stats": {}, "batch_stats": [], "memory_usage": []}


def test_statistics_move_after_inference(start_server, example_repo):
    server = start_server([example_repo])
    client = httpclient.InferenceServerClient(url=server.url)
    for rows in (2, 3):
        a = np.ones((rows, 3), np.float32)
        inputs = add_inputs(httpclient, a)
        client.infer("add_py", inputs)
    bad = np.ones((1, 3), np.float64)
    inputs = add_inputs(httpclient, bad)
    with pytest.raises(InferenceServerException):
        client.infer("add_py", inputs)  # refused before the queue: not counted, as in Triton
    (entry,) = client.get_inference_statistics("add_py")["model_stats"]
    assert entry["inference_count"] == 5 and entry["execution_count"] == 2
    assert entry["last_inference"] > 0
    inference = entry["inference_stats"]
    for kind in ("success", "queue", "compute_input", "compute_infer", "compute_output"):
        assert inference[kind]["count"] == 2 and inference[kind]["ns"] > 0, kind
    assert inference["fail"] == ZERO
    assert [b["batch_size"] for b in entry["batch_stats"]] == [2, 3]
    assert all(b["compute_infer"]["count"] == 1 for b in entry["batch_stats"])
    grpc_entry = grpcclient.InferenceServerClient(server.grpc_url).get_inference_statistics(
        "add_py", as_json=True)["model_stats"][0]
    assert int(grpc_entry["inference_count"]) == 5
    assert int(grpc_entry["inference_stats"]["success"]["count"]) == 2
    assert len(grpc_entry["batch_stats"]) == 2


def test_failures_inside_the_model_count_as_fail(server):
    before = _stats(server, "/v2/models/fail/stats")["model_stats"][0]["inference_stats"]["fail"]["count"]
    body = orjson.dumps({"inputs": [{"name": "X", "shape": [1], "datatype": "FP32", "data": [0]}]})
    assert server.post("/v2/models/fail/infer", body)[0] == 500
    after = _stats(server, "/v2/models/fail/stats")["model_stats"][0]["inference_stats"]["fail"]["count"]
    assert after == before + 1


def test_a_python_models_executions_and_error_responses_count_as_in_triton(start_server, test_repo):
    """A raising execute() fails its requests but is an execution all the same; a response the model
    itself sends with an error is a success (Triton's python backend counts it so); queue and
    compute times count for successes only."""
    server = start_server([test_repo], "--model-control-mode=explicit", "--load-model", "fail")
    for x in (0, 1, 5, 5):
        body = orjson.dumps({"inputs": [{"name": "X", "shape": [1], "datatype": "FP32", "data": [x]}]})
        assert server.post("/v2/models/fail/infer", body)[0] == {0: 500, 1: 400, 5: 200}[x]
    (entry,) = _stats(server, "/v2/models/fail/stats")["model_stats"]
    counts = {k: v["count"] for k, v in entry["inference_stats"].items()}
    assert (entry["inference_count"], entry["execution_count"]) == (3, 4)
    assert counts == {"success": 3, "fail": 1, "queue": 3, "compute_input": 3, "compute_infer": 3,
                      "compute_output": 3, "cache_hit": 0, "cache_miss": 0}
    assert [(b["batch_size"], b["compute_infer"]["count"]) for b in entry["batch_stats"]] == [(1, 4)]


def test_all_models_and_unknown_models(server):
    names = {e["name"] for e in _stats(server, "/v2/models/stats")["model_stats"]}
    assert {"add", "add_py", "identity"} <= names
    status, _, raw = server.get("/v2/models/nope/stats")
    assert status == 400 and orjson.loads(raw)["error"] == "requested model 'nope' is not available"
    status, _, raw = server.get("/v2/models/add/versions/3/stats")
    assert status == 400
    assert orjson.loads(raw)["error"] == "requested model version is not available for model 'add'"
    with pytest.raises(InferenceServerException) as e:
        grpcclient.InferenceServerClient(server.grpc_url).get_inference_statistics("nope")
    assert e.value.status() == "StatusCode.INVALID_ARGUMENT"
