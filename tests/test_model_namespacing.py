"""Model namespacing (--model-namespacing=true): each repository is a namespace, so models of one
name in two repositories load side by side; an ensemble's steps and a python model's BLS calls find
the model of their own repository first; a request naming a model several repositories hold is
refused with Triton's words (400 / INVALID_ARGUMENT); metrics carry Triton's `namespace` label, and
the repository index, statistics and status document list each model."""

from __future__ import annotations

import shutil

import numpy as np
import orjson
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from conftest import http_request, scrape_metrics, write_model

IO = ('input [ { name: "X", data_type: TYPE_INT32, dims: [ 2 ] } ]\n'
      'output [ { name: "Y", data_type: TYPE_INT32, dims: [ 2 ] } ]\n')
STEP_PY = ("import triton_python_backend_utils as pb_utils\n\nclass TritonPythonModel:\n"
           "    def execute(self, requests):\n        return [pb_utils.InferenceResponse([pb_utils.Tensor('Y', "
           "pb_utils.get_input_tensor_by_name(r, 'X').as_numpy() + {delta})]) for r in requests]\n")
BLS_PY = ("import triton_python_backend_utils as pb_utils\n\nclass TritonPythonModel:\n"
          "    def execute(self, requests):\n        out = []\n        for r in requests:\n"
          "            called = pb_utils.InferenceRequest(model_name='step', requested_output_names=['Y'],\n"
          "                inputs=[pb_utils.get_input_tensor_by_name(r, 'X')]).exec()\n"
          "            if called.has_error():\n"
          "                raise pb_utils.TritonModelException(called.error().message())\n"
          "            out.append(pb_utils.InferenceResponse([pb_utils.get_output_tensor_by_name(called, 'Y')]))\n"
          "        return out\n")
ENSEMBLE = ('platform: "ensemble"\n' + IO +
            'ensemble_scheduling { step [ { model_name: "step", model_version: -1, input_map { key: "X" value: "X" } '
            'output_map { key: "Y" value: "Y" } } ] }\n')
AMBIGUOUS = ("There are 2 identifiers of model 'step' in global map, model namespace must be provided to resolve "
             "ambiguity.")


def _repositories(tmp_path):
    """Two repositories that each hold a model `step` (adding 1 in `up`, subtracting 1 in `down`), an
    ensemble of it and a python model calling it, under names of their own."""
    up, down = tmp_path / "up", tmp_path / "down"
    for repo, delta, suffix in ((up, 1, "up"), (down, -1, "down")):
        write_model(repo, "step", STEP_PY.format(delta=delta), 'backend: "python"\n' + IO)
        (repo / f"ensemble_{suffix}" / "1").mkdir(parents=True)
        (repo / f"ensemble_{suffix}" / "config.pbtxt").write_text(ENSEMBLE)
        write_model(repo, f"bls_{suffix}", BLS_PY, 'backend: "python"\n' + IO)
    return up, down


def _infer(client, model: str) -> list[int]:
    x = httpclient.InferInput("X", [2], "INT32")
    x.set_data_from_numpy(np.array([10, 20], np.int32))
    return client.infer(model, [x]).as_numpy("Y").tolist()


def test_models_of_one_name_in_two_repositories_serve_side_by_side(start_server, tmp_path):
    up, down = _repositories(tmp_path)
    server = start_server([up, down], "--model-namespacing=true")
    client = httpclient.InferenceServerClient(server.url)
    # each ensemble's step and each BLS call runs the model of its own repository
    assert _infer(client, "ensemble_up") == [11, 21]
    assert _infer(client, "ensemble_down") == [9, 19]
    assert _infer(client, "bls_up") == [11, 21]
    assert _infer(client, "bls_down") == [9, 19]

    # the name alone is ambiguous: Triton's words, 400 and INVALID_ARGUMENT
    with pytest.raises(InferenceServerException) as e:
        _infer(client, "step")
    assert e.value.message() == AMBIGUOUS and e.value.status() == "400"
    status, _, body = server.get("/v2/models/step")
    assert status == 400 and orjson.loads(body)["error"] == AMBIGUOUS
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    x = grpcclient.InferInput("X", [2], "INT32")
    x.set_data_from_numpy(np.array([1, 2], np.int32))
    with pytest.raises(InferenceServerException) as e:
        grpc.infer("step", [x])
    assert e.value.status() == "StatusCode.INVALID_ARGUMENT" and e.value.message() == AMBIGUOUS
    assert not client.is_model_ready("step")

    # the index lists each, by repository then name, as Triton's does
    rows = [(r["name"], r.get("state")) for r in client.get_model_repository_index()]
    assert rows == [("bls_down", "READY"), ("ensemble_down", "READY"), ("step", "READY"),
                    ("bls_up", "READY"), ("ensemble_up", "READY"), ("step", "READY")]
    stats = [s["name"] for s in client.get_inference_statistics()["model_stats"]]
    assert sorted(stats) == ["bls_down", "bls_up", "ensemble_down", "ensemble_up", "step", "step"]

    # metrics: Triton's namespace label tells the two apart; each ran twice (its ensemble, its BLS call)
    metrics = scrape_metrics(server)
    for repo in (up, down):
        key = f'nv_inference_request_success{{model="step",namespace="{repo}",version="1"}}'
        assert metrics[key] == 2, sorted(k for k in metrics if k.startswith("nv_inference_request_success"))
    status, _, body = http_request(server.metrics_port, "GET", "/status.json")
    shown = sorted((r["name"], r["namespace"]) for r in orjson.loads(body)["models"] if r["name"] == "step")
    assert shown == [("step", str(down)), ("step", str(up))]


def test_without_namespacing_a_name_in_two_repositories_fails_its_load(start_server, tmp_path):
    up, down = _repositories(tmp_path)
    server = start_server([up, down], "--exit-on-error=false", "--strict-readiness=false")
    client = httpclient.InferenceServerClient(server.url)
    rows = {r["name"]: r for r in client.get_model_repository_index()}
    assert "model 'step' appears in 2 model repositories" in rows["step"]["reason"], rows
    assert "--model-namespacing=true" in rows["step"]["reason"]
    metrics = scrape_metrics(server)
    assert not any("namespace=" in k for k in metrics), "no namespace label without namespacing"


def test_a_step_resolves_to_another_repository_when_its_own_has_none(start_server, tmp_path):
    up, down = _repositories(tmp_path)
    server = start_server([up, down], "--model-namespacing=true", "--model-control-mode=explicit")
    client = httpclient.InferenceServerClient(server.url)
    shutil.move(up / "step", tmp_path / "step_up")
    client.load_model("ensemble_up")  # its step comes from `down`, the only repository that has one
    assert _infer(client, "ensemble_up") == [9, 19]
    assert _infer(client, "step") == [9, 19]  # one loaded: no ambiguity

    shutil.move(tmp_path / "step_up", up / "step")
    client.load_model("ensemble_up")  # reloaded: its own repository's step now, loaded with it
    assert _infer(client, "ensemble_up") == [11, 21]
    with pytest.raises(InferenceServerException, match="resolve ambiguity"):
        _infer(client, "step")

    client.unload_model("step")  # a name unloads each model of that name
    states = {(r["name"], r.get("state")) for r in client.get_model_repository_index() if r["name"] == "step"}
    assert states == {("step", "UNAVAILABLE")}
    client.load_model("step")  # and loads each
    assert [r.get("state") for r in client.get_model_repository_index() if r["name"] == "step"] == ["READY"] * 2


def test_a_startup_model_may_be_named_by_its_key(start_server, tmp_path):
    """With namespacing, --load-model takes a model's key (`<repository>::<name>`) as well as a name; a
    name no repository holds fails in Triton's words."""
    up, down = _repositories(tmp_path)
    server = start_server([up, down], "--model-namespacing=true", "--model-control-mode=explicit",
                          f"--load-model={up}::step", "--load-model=nowhere", "--exit-on-error=false",
                          "--strict-readiness=false")
    assert _infer(httpclient.InferenceServerClient(server.url), "step") == [11, 21]
    index = orjson.loads(server.post("/v2/repository/index", b"{}")[2])
    assert {"name": "nowhere", "state": "UNAVAILABLE",
            "reason": "failed to poll model 'nowhere': model not found in any model repository."} in index, index
