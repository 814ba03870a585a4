"""Trace settings (global and per model, HTTP and gRPC) and the TIMESTAMPS traces they produce."""

import json

import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from conftest import http_request, infer_add

STAGES = ["REQUEST_START", "QUEUE_START", "COMPUTE_START", "COMPUTE_INPUT_END", "COMPUTE_OUTPUT_START",
          "COMPUTE_END", "REQUEST_END"]


def _infer(client, model="add", n=1):
    for _ in range(n):
        infer_add(client, model)


def test_timestamps_traces_of_sampled_requests(start_server, example_repo, tmp_path):
    trace_file = tmp_path / "trace.json"
    server = start_server([example_repo], "--trace-config", f"triton,file={trace_file}",
                          "--trace-config", "level=TIMESTAMPS", "--trace-config", "rate=2")
    client = httpclient.InferenceServerClient(server.url)
    assert client.get_trace_settings() == {"trace_file": str(trace_file), "trace_level": ["TIMESTAMPS"],
                                           "trace_rate": "2", "trace_count": "-1", "log_frequency": "0",
                                           "trace_mode": "triton"}
    _infer(client, n=6)
    server.stop()
    entries = json.loads(trace_file.read_text())
    heads = [e for e in entries if "model_name" in e]
    assert len(heads) == 3  # one request in two
    assert all(h["model_name"] == "add" and h["model_version"] == 1 for h in heads)
    for e in entries:
        if "timestamps" in e:
            names = [t["name"] for t in e["timestamps"]]
            assert sorted(names) == sorted(STAGES)
            ns = {t["name"]: t["ns"] for t in e["timestamps"]}
            assert ns["REQUEST_START"] <= ns["QUEUE_START"] <= ns["COMPUTE_START"] <= ns["COMPUTE_END"] \
                <= ns["REQUEST_END"]


def test_per_model_settings_over_grpc_and_count(start_server, example_repo, tmp_path):
    trace_file = tmp_path / "py.json"
    server = start_server([example_repo], "--trace-config", f"file={trace_file}")
    g = grpcclient.InferenceServerClient(server.grpc_url)
    settings = g.update_trace_settings("add_py", {"trace_level": ["TIMESTAMPS"], "trace_rate": "1",
                                                  "trace_count": "2"}, as_json=True)
    assert settings["settings"]["trace_level"]["value"] == ["TIMESTAMPS"]
    assert g.get_trace_settings(as_json=True)["settings"]["trace_level"]["value"] == ["OFF"]  # global unchanged
    client = httpclient.InferenceServerClient(server.url)
    _infer(client, "add_py", n=4)
    _infer(client, "add", n=2)
    server.stop()
    entries = json.loads(trace_file.read_text())
    assert [e["model_name"] for e in entries if "model_name" in e] == ["add_py", "add_py"]


def test_bad_trace_settings_are_refused(start_server, example_repo):
    server = start_server([example_repo])
    client = httpclient.InferenceServerClient(server.url)
    for settings, message in (({"trace_level": ["DETAILED"]}, "trace level 'DETAILED' is not supported"),
                              ({"trace_rate": "0"}, "'trace_rate' must be a positive number"),
                              ({"trace_colour": "red"}, "unknown trace setting 'trace_colour'")):
        with pytest.raises(InferenceServerException, match=message):
            client.update_trace_settings(settings=settings)
    for c in (client, grpcclient.InferenceServerClient(server.grpc_url)):
        with pytest.raises(InferenceServerException) as e:
            c.get_trace_settings("does-not-exist")
        assert e.value.message() == "Request for unknown model : does-not-exist"  # Triton's words, space and all


def test_the_trace_file_cannot_be_moved_over_the_network(start_server, example_repo, tmp_path):
    server = start_server([example_repo])
    elsewhere = tmp_path / "elsewhere.json"
    for c, code in ((httpclient.InferenceServerClient(server.url), "501"),
                    (grpcclient.InferenceServerClient(server.grpc_url), "StatusCode.UNIMPLEMENTED")):
        for model in ("", "add_py"):
            for value in (str(elsewhere), None):
                with pytest.raises(InferenceServerException) as e:
                    c.update_trace_settings(model, {"trace_file": value})
                assert (e.value.status(), e.value.message()) == (code, "trace file location can not be updated "
                                                                       "through network protocol")
    assert not elsewhere.exists()


def trace_settings_walk(port: int) -> list:
    """Change and clear global and per-model settings over HTTP: each answer, in order."""
    steps = [("GET", "/v2/trace/setting", None),
             ("POST", "/v2/trace/setting", {"trace_rate": "7", "log_frequency": "3"}),
             ("GET", "/v2/models/add_py/trace/setting", None),
             ("POST", "/v2/models/add_py/trace/setting", {"trace_count": "9"}),
             ("POST", "/v2/trace/setting", {"trace_rate": "11"}), ("GET", "/v2/models/add_py/trace/setting", None),
             ("POST", "/v2/trace/setting", {"trace_rate": None}),
             ("POST", "/v2/models/add_py/trace/setting", {"trace_count": None}),
             ("GET", "/v2/trace/setting", None), ("GET", "/v2/models/does-not-exist/trace/setting", None),
             ("POST", "/v2/trace/setting", {"trace_level": ["TIMESTAMPS", "TENSORS"]}),
             ("POST", "/v2/trace/setting", {"trace_level": None})]
    out = []
    for method, path, body in steps:
        status, _, raw = http_request(port, method, path, None if body is None else json.dumps(body).encode())
        out.append((status, json.loads(raw)))
    return out


TRACE_FLAGS = ["--trace-config", "level=TIMESTAMPS", "--trace-config", "rate=5", "--trace-config", "count=100"]


def test_settings_start_from_the_flags_models_follow_the_global_ones_and_null_goes_back(start_server, example_repo,
                                                                                       tmp_path):
    trace_file = tmp_path / "t.json"
    server = start_server([example_repo], *TRACE_FLAGS, "--trace-config", f"triton,file={trace_file}")
    answers = trace_settings_walk(server.http_port)
    assert all(status == 200 for status, _ in answers[:9])
    assert answers[0][1]["trace_rate"] == "5" and answers[0][1]["trace_count"] == "100"  # from the flags
    assert answers[3][1]["trace_count"] == "9" and answers[5][1]["trace_rate"] == "11"  # follows the global rate
    assert answers[6][1]["trace_rate"] == "5"  # null: back to the startup value, not the built-in 1000
    assert answers[7][1]["trace_count"] == "100"  # a model's null: back to the global value
    assert answers[9] == (400, {"error": "Request for unknown model : does-not-exist"})
    assert answers[10][1]["trace_level"] == ["TIMESTAMPS", "TENSORS"]
    assert answers[11][1]["trace_level"] == ["TIMESTAMPS"]


def test_tensors_level_records_inputs_and_outputs(start_server, example_repo, tmp_path):
    trace_file = tmp_path / "tensors.json"
    server = start_server([example_repo], "--trace-config", "level=TENSORS", "--trace-config", "rate=1",
                          "--trace-config", f"file={trace_file}")
    client = httpclient.InferenceServerClient(server.url)
    _infer(client, "add_py", n=1)
    server.stop()
    entries = json.loads(trace_file.read_text())
    tensors = [e for e in entries if "activity" in e]
    assert [(e["activity"], e["tensor"]["name"]) for e in tensors] == [
        ("TENSOR_QUEUE_INPUT", "A"), ("TENSOR_QUEUE_INPUT", "B"), ("TENSOR_BACKEND_OUTPUT", "C")]
    assert all(e["tensor"]["dtype"] == "FP32" and e["tensor"]["shape"] for e in tensors)
    assert not any("timestamps" in e for e in entries)  # TENSORS alone: no timestamps
