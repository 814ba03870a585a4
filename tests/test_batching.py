"""Dynamic batching through the real server: requests are merged under load, never across
different shapes, and each client gets exactly its own rows back."""

import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import tritonclient.http as httpclient

import procfs
from conftest import add_inputs


def _infer_batch_report(url: str, x: np.ndarray):
    client = httpclient.InferenceServerClient(url=url)
    inp = httpclient.InferInput("X", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    result = client.infer("batch_report", [inp])
    return result.as_numpy("Y"), int(result.as_numpy("N")[0, 0]), int(result.as_numpy("M")[0, 0])


def _all_at_once(server, xs):
    """Send every request at the same time; each must come back with its own rows. (N, M) each."""
    with ThreadPoolExecutor(len(xs)) as pool:
        results = list(pool.map(lambda x: _infer_batch_report(server.url, x), xs))
    for x, (y, _, _) in zip(xs, results):
        np.testing.assert_array_equal(y, x)
    return [(n, m) for _, n, m in results]


def test_concurrent_requests_reach_execute_together(server):
    results = _all_at_once(server, [np.full((1, 4), i, dtype=np.float32) for i in range(16)])
    assert max(n for n, _ in results) > 1, "no execute() call received more than one request"


def test_requests_of_different_shapes_are_never_merged(server):
    xs = [np.full((1, 2 + i % 2), i, dtype=np.float32) for i in range(16)]
    xs.sort(key=lambda x: x.shape[1])
    results = _all_at_once(server, xs)
    assert max(n for n, _ in results) > 1, "nothing was batched: the test proves nothing"
    for _, m in results:
        assert m == 1


def test_batch_sizes_add_up_to_at_most_max_batch_size(server):
    results = _all_at_once(server, [np.full((3, 2), i, dtype=np.float32) for i in range(8)])
    assert max(n for n, _ in results) == 2, "no batch of two: the test proves nothing"
    for n, _ in results:
        assert n * 3 <= 8  # batches of 3 rows: at most two requests fit in max_batch_size 8


def test_onnx_batches_are_split_back_per_request(server):
    def one(i):
        client = httpclient.InferenceServerClient(url=server.url)
        rows = 1 + i % 4
        a = np.arange(rows * 3, dtype=np.float32).reshape(rows, 3) + i
        b = np.full((rows, 3), i, dtype=np.float32)
        inputs = add_inputs(httpclient, a, b)
        return a + b, client.infer("add", inputs).as_numpy("C")

    def executions() -> tuple[int, int]:
        stats = httpclient.InferenceServerClient(url=server.url).get_inference_statistics("add")["model_stats"][0]
        return stats["execution_count"], stats["inference_stats"]["success"]["count"]

    runs_before, requests_before = executions()
    with ThreadPoolExecutor(12) as pool:
        for want, got in pool.map(one, range(120)):
            np.testing.assert_array_equal(got, want)
    runs, requests = executions()
    assert requests - requests_before == 120
    assert runs - runs_before < 120  # some ran together: answers were split back from batches


def test_large_tensors_round_trip(server):
    client = httpclient.InferenceServerClient(url=server.url)
    a = np.random.default_rng(0).random((8, 3), dtype=np.float32)
    big = np.random.default_rng(1).random((4, 300_000), dtype=np.float32)  # 4.8 MB
    inp = httpclient.InferInput("X", list(big.shape), "FP32")
    inp.set_data_from_numpy(big)
    result = client.infer("batch_report", [inp])
    np.testing.assert_array_equal(result.as_numpy("Y"), big)
    inputs = add_inputs(httpclient, a)
    np.testing.assert_array_equal(client.infer("add", inputs).as_numpy("C"), a + a)


def test_the_server_polls_only_while_a_batch_is_near_and_sleeps_when_idle(server):
    """The server polls (--busy-poll-us) after each batch: the window closes by itself, so an idle
    server uses next to no CPU (under 0.3 s in a 1 s stretch; a server that kept polling would use
    all of it)."""
    client = httpclient.InferenceServerClient(url=server.url)
    for _ in range(20):
        client.infer("add_py", add_inputs(httpclient, np.ones((1, 3), np.float32)))
    samples = [(time.monotonic(), procfs.cpu_seconds(server.pid))]

    def idle_for_a_second() -> bool:
        now, cpu = time.monotonic(), procfs.cpu_seconds(server.pid)
        samples.append((now, cpu))
        return any(now - t >= 1.0 and cpu - c < 0.3 for t, c in samples)

    server.wait_until(idle_for_a_second, 15, "a second in which the idle server used under 0.3 s of CPU")
