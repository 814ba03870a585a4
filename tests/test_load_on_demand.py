"""Models loaded on demand under a budget (--load-on-demand, --max-resident-models): nothing loads at
startup; a model loads on the first request for it (HTTP, gRPC, in-process), which waits for it;
past the budget the least recently used model not in use is unloaded, never one with an open
sequence; the repository index, the metrics and the status document say what is resident and count
loads and evictions."""

import re
import shutil

import numpy as np
import orjson
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from conftest import TEST_MODELS, http_request, infer_add, scrape_metrics

ONES = np.ones((1, 3), np.float32)


def _repository(root, examples, n: int):
    """n python add models (m0, m1, ...), an ONNX one (onnx_add) and a sequence model."""
    repo = root / "repo"
    for i in range(n):
        shutil.copytree(examples / "add_py", repo / f"m{i}")
        config = repo / f"m{i}" / "config.pbtxt"
        config.write_text(config.read_text().replace('name: "add_py"', f'name: "m{i}"'))
    shutil.copytree(examples / "add", repo / "onnx_add")
    config = repo / "onnx_add" / "config.pbtxt"
    config.write_text(config.read_text().replace('name: "add"', 'name: "onnx_add"'))
    shutil.copytree(TEST_MODELS / "sequence_slots", repo / "sequence_slots")
    return repo


def _add(client, model):
    return infer_add(client, model, ONES).tolist()


def _slots(client, x, seq, **flags):
    inp = grpcclient.InferInput("X", [1, 1], "INT32")
    inp.set_data_from_numpy(np.array([[x]], np.int32))
    return int(client.infer("sequence_slots", [inp], sequence_id=seq, **flags).as_numpy("SUM")[0, 0])


def _resident(server) -> set[str]:
    return {key.split('"')[1] for key in scrape_metrics(server) if key.startswith("tritonmp_model_resident{")}


@pytest.fixture
def repo(tmp_path, example_repo):
    return _repository(tmp_path, example_repo, 4)


def test_models_load_on_their_first_request_and_the_least_recently_used_go(start_server, repo):
    server = start_server([repo], "--load-on-demand", "--max-resident-models", "3")
    http = httpclient.InferenceServerClient(server.url)
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    assert http.is_server_ready() and not _resident(server)  # nothing loaded at startup
    assert {row["name"] for row in http.get_model_repository_index()} >= {"m0", "m3", "onnx_add"}
    assert not http.is_model_ready("m0")  # readiness says what is, and loads nothing

    # a sequence opens on sequence_slots: it is in use from then on, and never unloaded to make room
    assert _slots(grpc, 5, 1, sequence_start=True) == 5
    assert _add(http, "m0") == [[2, 2, 2]]  # HTTP
    assert _add(grpc, "onnx_add") == [[2, 2, 2]]  # gRPC, an ONNX model
    assert _resident(server) == {"sequence_slots", "m0", "onnx_add"}
    # a fourth: the least recently used model not in use (m0) makes room
    assert grpc.get_model_metadata("m1").name == "m1"  # metadata waits for the load too
    assert _resident(server) == {"sequence_slots", "onnx_add", "m1"}
    assert _add(http, "m2") == [[2, 2, 2]]
    assert _resident(server) == {"sequence_slots", "m1", "m2"}
    assert _slots(grpc, 7, 1, sequence_end=True) == 12  # the sequence's state was kept all along

    index = {(row["name"], row.get("state")): row for row in http.get_model_repository_index()}
    assert index[("m0", "UNAVAILABLE")]["reason"].startswith("unloaded: least recently used")
    assert ("m2", "READY") in index and ("m3", None) in index
    metrics = scrape_metrics(server)
    assert metrics["tritonmp_model_loads_on_demand_total"] == 5
    assert metrics["tritonmp_model_evictions_total"] == 2
    assert metrics["tritonmp_resident_models"] == 3 and metrics["tritonmp_resident_memory_bytes"] > 0
    status, _, raw = http_request(server.metrics_port, "GET", "/status.json")
    assert status == 200
    assert orjson.loads(raw)["residency"] | {"memory_bytes": 0} == {
        "resident": 3, "max_models": 3, "memory_bytes": 0, "max_memory_bytes": 0, "loads": 5, "evictions": 2,
        "loading": []}

    # an evicted model loads again; an unknown one is still unknown
    assert _add(grpc, "m0") == [[2, 2, 2]]
    with pytest.raises(InferenceServerException, match="unknown model"):
        _add(http, "nowhere")


def test_concurrent_first_requests_share_one_load(start_server, repo):
    import threading

    server = start_server([repo], "--load-on-demand")
    answers, threads = [], []
    for _ in range(8):
        client = httpclient.InferenceServerClient(server.url)
        threads.append(threading.Thread(target=lambda c=client: answers.append(_add(c, "m3"))))
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert answers == [[[2, 2, 2]]] * 8
    assert scrape_metrics(server)["tritonmp_model_loads_on_demand_total"] == 1
    assert server.log().count("loaded 'm3' on demand") == 1


def test_in_process_server_loads_on_demand(repo):
    from tritonmp import tritonserver

    server = tritonserver.Server(model_repository=str(repo), load_on_demand=True, max_resident_models=1)
    server.start(wait_until_ready=True)
    try:
        for model in ("m0", "m1", "m0"):
            (response,) = server.model(model).infer(inputs={"A": ONES, "B": ONES})
            np.testing.assert_array_equal(np.from_dlpack(response.outputs["C"]), ONES * 2)
        assert server.model("m1").metadata()["name"] == "m1"
        assert {m.name for m in server.models(exclude_not_ready=True).values()} == {"m1"}
    finally:
        server.stop()


def test_the_status_page_shows_what_is_resident(start_server, repo, tmp_path):
    from test_status_page import CHROMIUM, _render

    if CHROMIUM is None:
        pytest.skip("Debian's chromium is not installed (.ci/run installs it)")
    server = start_server([repo], "--load-on-demand", "--max-resident-models", "1")
    http = httpclient.InferenceServerClient(server.url)
    for model in ("m0", "m1"):
        assert _add(http, model) == [[2, 2, 2]]
    dom = _render(server, tmp_path)
    assert re.search(r'id="residency-card"(?! hidden)[^>]*>', dom)  # shown where models load on demand
    assert '<div class="value" id="resident">1 / 1</div>' in dom
    assert "2 loads · 1 evictions" in dom


def test_a_stream_streams_a_decoupled_model_that_loads_on_demand(start_server, tmp_path):
    """The first stream request for a decoupled model that is not resident yet: its responses go back
    as they are made, not held until its request ends (here the request never ends by itself: the
    ticker sends two responses, then waits to be cancelled)."""
    import queue

    repo = tmp_path / "repo"
    shutil.copytree(TEST_MODELS / "ticker", repo / "ticker")
    server = start_server([repo], "--load-on-demand")
    assert _resident(server) == set()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    got: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: got.put((result, error)))
    try:
        n = grpcclient.InferInput("N", [1], "INT32")
        n.set_data_from_numpy(np.array([-2], np.int32))
        client.async_stream_infer("ticker", [n], request_id="first")
        answers = [got.get(timeout=30) for _ in range(2)]
        assert [error for _, error in answers] == [None, None]
        assert [int(result.as_numpy("I")[0]) for result, _ in answers] == [0, 1]
    finally:
        client.stop_stream(cancel_requests=True)
    server.wait_until(lambda: "ticker: cancelled after 2 responses" in server.log(), 30, "the ticker's cancellation")
