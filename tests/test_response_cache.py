"""The response cache: identical requests are answered without running the model, counted as
cache hits in Triton's statistics; other requests and models without response_cache run."""

import shutil

import numpy as np
import tritonclient.http as httpclient

from conftest import infer_add


def _add(client, value):
    return infer_add(client, "add_py", np.full((1, 3), value, np.float32), request_id=f"r{value}")


def test_identical_requests_hit_the_cache(start_server, example_repo, tmp_path):
    repo = tmp_path / "repo"
    shutil.copytree(example_repo / "add_py", repo / "add_py")
    config = repo / "add_py" / "config.pbtxt"
    config.write_text(config.read_text() + "response_cache { enable: true }\n")
    server = start_server([repo], "--cache-config", "local,size=1048576")
    client = httpclient.InferenceServerClient(server.url)
    for _ in range(3):
        np.testing.assert_array_equal(_add(client, 1.0), np.full((1, 3), 2.0))
    np.testing.assert_array_equal(_add(client, 2.0), np.full((1, 3), 4.0))
    stats = client.get_inference_statistics("add_py")["model_stats"][0]
    assert stats["execution_count"] == 2  # one per distinct request
    assert stats["inference_stats"]["cache_hit"]["count"] == 2
    assert stats["inference_stats"]["cache_miss"]["count"] == 2
    assert stats["inference_stats"]["success"]["count"] == 4


def test_without_the_server_cache_nothing_is_cached(start_server, example_repo, tmp_path):
    repo = tmp_path / "repo"
    shutil.copytree(example_repo / "add_py", repo / "add_py")
    config = repo / "add_py" / "config.pbtxt"
    config.write_text(config.read_text() + "response_cache { enable: true }\n")
    server = start_server([repo])
    client = httpclient.InferenceServerClient(server.url)
    _add(client, 1.0)
    _add(client, 1.0)
    stats = client.get_inference_statistics("add_py")["model_stats"][0]
    assert stats["execution_count"] == 2 and stats["inference_stats"]["cache_hit"]["count"] == 0
