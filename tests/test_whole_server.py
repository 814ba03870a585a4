"""Every endpoint with every kind of model loaded (tests/whole_repo.py): inference, metadata, config,
statistics, the repository index, metrics, the status page and /status.json, trace and log settings,
shared-memory registration, load and unload, over HTTP, gRPC and the in-process API. A model that
fails to load and one that crash-loops sit beside the others and take nothing down with them."""

from __future__ import annotations

import numpy as np
import orjson
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException
from whole_repo import build, infer_probe, probe_inputs, served, walk_observability

from conftest import TEST_BACKENDS, scrape_metrics, serving

ARGS = ["--model-control-mode=explicit", "--load-model=*", "--exit-on-error=false", "--strict-readiness=false",
        "--allow-client-shm=true"]


@pytest.fixture(scope="module")
def whole(tmp_path_factory, example_repo):
    root = tmp_path_factory.mktemp("whole") / "repo"
    probes = build(root, example_repo)
    return root, probes


@pytest.fixture(scope="module")
def server(whole, tmp_path_factory):
    root, _ = whole
    with serving([root], ARGS, tmp_path_factory) as s:
        yield s


def test_every_kind_answers_over_http_and_grpc(server, whole):
    _, probes = whole
    for seq, name in enumerate(served(probes), start=1):
        probe = probes[name]
        for module, url in ((httpclient, server.url), (grpcclient, server.grpc_url)):
            if probe.stream and module is httpclient:
                continue  # a decoupled model answers over the gRPC stream
            try:
                probe.check(infer_probe(module, url, name, probe, seq))
            except Exception as e:
                raise AssertionError(f"{name} over {module.__name__}: {e}") from e
    for module, url in ((httpclient, server.url), (grpcclient, server.grpc_url)):  # classification, by labels
        result = module.InferenceServerClient(url).infer("scores", probe_inputs(module, probes["scores"]),
                                                         outputs=[module.InferRequestedOutput("Y", class_count=2)])
        assert result.as_numpy("Y").tolist() == [[b"3.000000:1:cat", b"2.000000:2:dog"]]


def test_health_generate_and_cuda_regions_beside_every_kind(server, whole):
    """Liveness and readiness (not strict: one model never loads), the generate extension on a python
    and an ONNX model and its stream on the decoupled one, and the CUDA shared-memory status."""
    http = httpclient.InferenceServerClient(server.url)
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    assert http.is_server_live() and http.is_server_ready() and grpc.is_server_live() and grpc.is_server_ready()
    for name in ("add", "add_py"):
        status, _, raw = server.post(f"/v2/models/{name}/generate", orjson.dumps({"A": [1, 2, 3], "B": [1, 1, 1]}))
        assert status == 200 and orjson.loads(raw)["C"] == [2, 3, 4], raw
    status, headers, raw = server.post("/v2/models/repeat/generate_stream", orjson.dumps({"N": [2]}))
    assert status == 200 and headers["content-type"].startswith("text/event-stream"), raw
    events = [orjson.loads(line[len(b"data: "):]) for line in raw.splitlines() if line.startswith(b"data: ")]
    assert [e["I"] for e in events] == [0, 1], events
    assert http.get_cuda_shared_memory_status() == [] and list(grpc.get_cuda_shared_memory_status().regions) == []


def test_metadata_config_and_readiness_of_every_model(server, whole):
    _, probes = whole
    http = httpclient.InferenceServerClient(server.url)
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    for name in served(probes):
        assert http.is_model_ready(name) and grpc.is_model_ready(name), name
        meta, config = http.get_model_metadata(name), http.get_model_config(name)
        assert meta["name"] == name and {i["name"] for i in meta["inputs"]} >= set(probes[name].inputs), name
        assert grpc.get_model_metadata(name).name == name and grpc.get_model_config(name).config.name == name
        assert config["name"] == name
    assert not http.is_model_ready("broken")
    with pytest.raises(InferenceServerException, match="broken"):
        http.get_model_metadata("broken")
    meta = http.get_server_metadata()
    assert meta["name"] == "triton" and "model_repository" in meta["extensions"]


def test_repository_index_lists_every_model_with_its_state(server, whole):
    _, probes = whole
    http = httpclient.InferenceServerClient(server.url)
    index = {row["name"]: row for row in http.get_model_repository_index()}
    assert set(index) == set(probes)
    for name in served(probes):
        assert index[name]["state"] == "READY", index[name]
    assert index["broken"]["state"] == "UNAVAILABLE" and "this model never loads" in index["broken"]["reason"]
    grpc_index = {m.name: m.state for m in grpcclient.InferenceServerClient(server.grpc_url)
                  .get_model_repository_index().models}
    assert grpc_index["broken"] == "UNAVAILABLE" and grpc_index["pipeline"] == "READY"


def test_metrics_status_page_and_statistics_with_every_kind_loaded(server, whole):
    _, probes = whole
    names = served(probes)
    for seq, name in enumerate(names, start=100):  # traffic for every model first, so each has counters
        probe = probes[name]
        probe.check(infer_probe(grpcclient, server.grpc_url, name, probe, seq))
    walk_observability(server, names)
    stats = {s["name"]: s for s in httpclient.InferenceServerClient(server.url)
             .get_inference_statistics()["model_stats"]}
    for name in names:
        assert stats[name]["inference_stats"]["success"]["count"] >= 1, name


def test_trace_and_log_settings_for_every_model(server, whole):
    _, probes = whole
    http = httpclient.InferenceServerClient(server.url)
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    for name in served(probes):
        assert http.update_trace_settings(name, {"trace_rate": "7"})["trace_rate"] == "7", name
        assert http.get_trace_settings(name)["trace_rate"] == "7"
        assert grpc.get_trace_settings(name).settings["trace_rate"].value == ["7"]
        http.update_trace_settings(name, {"trace_rate": None})
    assert http.get_trace_settings()["trace_rate"] == "1000"
    assert http.update_log_settings({"log_verbose_level": 1})["log_verbose_level"] == 1
    assert grpc.update_log_settings({"log_verbose_level": 0}).settings["log_verbose_level"].uint32_param == 0


def test_shared_memory_inputs_and_outputs_beside_every_kind(server, whole):
    _, probes = whole
    key = f"/whole_{server.pid}"
    row = np.arange(3, dtype=np.float32).reshape(1, 3)
    handle = shm.create_shared_memory_region("whole", key, 64)
    try:
        shm.set_shared_memory_region(handle, [row])
        for module, url in ((httpclient, server.url), (grpcclient, server.grpc_url)):
            client = module.InferenceServerClient(url)
            client.register_system_shared_memory("whole", key, 64)
            try:
                status = client.get_system_shared_memory_status()
                regions = [r["name"] for r in status] if module is httpclient else list(status.regions)
                assert "whole" in regions
                for name, out_name in (("add", "C"), ("add_py", "C"), ("ov_add", "C")):
                    a, b = module.InferInput("A", [1, 3], "FP32"), module.InferInput("B", [1, 3], "FP32")
                    a.set_shared_memory("whole", 12)
                    b.set_data_from_numpy(np.ones((1, 3), np.float32))
                    out = module.InferRequestedOutput(out_name)
                    out.set_shared_memory("whole", 12, offset=16)
                    client.infer(name, [a, b], outputs=[out])
                    got = shm.get_contents_as_numpy(handle, np.float32, [1, 3], offset=16)
                    np.testing.assert_array_equal(got, row + 1, err_msg=name)
                a, b = module.InferInput("IN_A", [1, 3], "FP32"), module.InferInput("IN_B", [1, 3], "FP32")
                a.set_shared_memory("whole", 12)
                b.set_data_from_numpy(np.ones((1, 3), np.float32))
                result = client.infer("pipeline", [a, b])  # an ensemble reads inputs from a region too
                np.testing.assert_array_equal(result.as_numpy("DOUBLED"), (row + 1) * 2)
            finally:
                client.unregister_system_shared_memory("whole")
        walk_observability(server, served(probes))
    finally:
        shm.destroy_shared_memory_region(handle)


def test_unload_and_load_every_kind_with_the_endpoints_answering(server, whole):
    _, probes = whole
    http = httpclient.InferenceServerClient(server.url)
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    names = [n for n in served(probes) if n not in ("add", "add_py")]  # the pipeline's steps stay
    for i, name in enumerate(names):
        client = http if i % 2 else grpc
        client.unload_model(name)
        assert not http.is_model_ready(name), name
        walk_observability(server, [n for n in served(probes) if n != name])
        client.load_model(name)
        assert http.is_model_ready(name), name
        probe = probes[name]
        probe.check(infer_probe(grpcclient, server.grpc_url, name, probe, 200 + i))
    with pytest.raises(InferenceServerException, match="this model never loads"):
        http.load_model("broken")
    walk_observability(server, served(probes))


def test_a_crash_loop_takes_only_its_model_down(server, whole):
    _, probes = whole
    http = httpclient.InferenceServerClient(server.url)
    probe = probes["crashloop"]
    probe.check(infer_probe(httpclient, server.url, "crashloop", probe, 300))
    x = httpclient.InferInput("X", [1], "FP32")
    x.set_data_from_numpy(np.array([-1.0], np.float32))
    with pytest.raises(InferenceServerException):
        http.infer("crashloop", [x])  # its worker dies, and no restart comes up again

    def down():
        row = next(r for r in http.get_model_repository_index() if r["name"] == "crashloop")
        return row["state"] == "UNAVAILABLE"

    server.wait_until(down, 120, "the crash-looping model to be given up")
    row = next(r for r in http.get_model_repository_index() if r["name"] == "crashloop")
    assert "died or failed to start 5 times" in row["reason"] and "no longer restarted" in row["reason"]
    assert scrape_metrics(server)['tritonmp_worker_restarts_total{model="crashloop",version="1"}'] == 4
    status, _, raw = server.post("/v2/models/crashloop/infer", orjson.dumps(
        {"inputs": [{"name": "X", "shape": [1], "datatype": "FP32", "data": [1]}]}))
    assert (status, orjson.loads(raw)) == (404, {"error": "Request for unknown model: 'crashloop' has no available "
                                                          "versions"})  # Triton's answer for no version it can serve
    walk_observability(server, served(probes))
    for seq, name in enumerate(served(probes), start=400):
        probes[name].check(infer_probe(grpcclient, server.grpc_url, name, probes[name], seq))


def test_the_in_process_api_serves_every_kind(whole):
    from tritonmp import tritonserver

    root, probes = whole
    names = served(probes)
    with tritonserver.Server(model_repository=str(root), model_control_mode=tritonserver.ModelControlMode.EXPLICIT,
                             startup_models=names, backend_directory=str(TEST_BACKENDS)) as server:
        assert set(names) <= {name for name, _ in server.models()}
        for seq, name in enumerate(names, start=500):
            model, probe = server.model(name), probes[name]
            assert model.metadata()["name"] == name and model.config()["name"] == name
            kwargs = {"correlation_id": seq, "flags": 1 | 2} if probe.sequence else {}  # start and end
            outputs: dict[str, list] = {}
            for response in model.infer(inputs=probe.inputs, raise_on_error=True, **kwargs):
                for out_name, tensor in response.outputs.items():
                    outputs.setdefault(out_name, []).append(
                        tensor.to_bytes_array() if tensor.data_type == tritonserver.DataType.BYTES
                        else np.from_dlpack(tensor))
            probe.check({k: np.concatenate(v) if probe.stream else v[0] for k, v in outputs.items()})
            assert model.statistics()["model_stats"][0]["inference_stats"]["success"]["count"] >= 1, name
        with pytest.raises(tritonserver.TritonError, match="this model never loads"):
            server.load("broken")
        text = server.metrics()
        for name in names:
            assert f'model="{name}"' in text, name
