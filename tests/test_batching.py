"""Dynamic batching through the real server: requests are merged under load, never across
different shapes, and each client gets exactly its own rows back."""

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import tritonclient.http as httpclient


def _infer_batch_report(url: str, x: np.ndarray):
    client = httpclient.InferenceServerClient(url=url)
    inp = httpclient.InferInput("X", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    result = client.infer("batch_report", [inp])
    return result.as_numpy("Y"), int(result.as_numpy("N")[0, 0]), int(result.as_numpy("M")[0, 0])


def test_concurrent_requests_reach_execute_together(server):
    xs = [np.full((1, 4), i, dtype=np.float32) for i in range(16)]
    with ThreadPoolExecutor(16) as pool:
        results = list(pool.map(lambda x: _infer_batch_report(server.url, x), xs))
    for x, (y, _, _) in zip(xs, results):
        np.testing.assert_array_equal(y, x)
    assert max(n for _, n, _ in results) > 1, "no execute() call received more than one request"


def test_requests_of_different_shapes_are_never_merged(server):
    xs = [np.full((1, 2 + i % 2), i, dtype=np.float32) for i in range(16)]
    xs.sort(key=lambda x: x.shape[1])
    with ThreadPoolExecutor(16) as pool:
        results = list(pool.map(lambda x: _infer_batch_report(server.url, x), xs))
    for x, (y, _, m) in zip(xs, results):
        np.testing.assert_array_equal(y, x)
        assert m == 1


def test_batch_sizes_add_up_to_at_most_max_batch_size(server):
    xs = [np.full((3, 2), i, dtype=np.float32) for i in range(8)]
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda x: _infer_batch_report(server.url, x), xs))
    for x, (y, n, _) in zip(xs, results):
        np.testing.assert_array_equal(y, x)
        assert n * 3 <= 8  # batches of 3 rows: at most two requests fit in max_batch_size 8


def test_onnx_batches_are_split_back_per_request(server):
    def one(i):
        client = httpclient.InferenceServerClient(url=server.url)
        rows = 1 + i % 4
        a = np.arange(rows * 3, dtype=np.float32).reshape(rows, 3) + i
        b = np.full((rows, 3), i, dtype=np.float32)
        inputs = [httpclient.InferInput("A", a.shape, "FP32"), httpclient.InferInput("B", b.shape, "FP32")]
        inputs[0].set_data_from_numpy(a)
        inputs[1].set_data_from_numpy(b)
        return a + b, client.infer("add", inputs).as_numpy("C")

    with ThreadPoolExecutor(12) as pool:
        for want, got in pool.map(one, range(120)):
            np.testing.assert_array_equal(got, want)


def test_large_tensors_round_trip(server):
    client = httpclient.InferenceServerClient(url=server.url)
    a = np.random.default_rng(0).random((8, 3), dtype=np.float32)
    big = np.random.default_rng(1).random((4, 300_000), dtype=np.float32)  # 4.8 MB
    inp = httpclient.InferInput("X", list(big.shape), "FP32")
    inp.set_data_from_numpy(big)
    result = client.infer("batch_report", [inp])
    np.testing.assert_array_equal(result.as_numpy("Y"), big)
    inputs = [httpclient.InferInput("A", a.shape, "FP32"), httpclient.InferInput("B", a.shape, "FP32")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(a)
    np.testing.assert_array_equal(client.infer("add", inputs).as_numpy("C"), a + a)
