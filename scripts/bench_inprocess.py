"""The in-process API's cost per request beside HTTP and gRPC, on the same machine and models:

1. the ONNX add model, concurrency 1 and 16: requests per second and median latency through
   `tritonmp.tritonserver` (threads calling Model.infer), tritonclient HTTP and tritonclient gRPC
   against the `tritonmp` command;
2. 64 MiB tensors (an ONNX identity model): in-process (a numpy input written once into the memory
   the worker reads; the output a view of the arena the worker wrote it into), in-process from a
   `Server.shared_array` (the worker reads the input in place), beside the client
   system-shared-memory path (its input written into the region for each request, and once for all),
   and a bare 64 MiB memcpy.

    .venv/bin/python scripts/bench_inprocess.py
"""

from __future__ import annotations

import os
import shutil
import statistics
import sys
import tempfile
import threading
import time

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
from bench_targets import Server, median_us, setup_64mib, shm_round_trip_us  # noqa: E402

from make_example_repo import binary_op_model, write  # noqa: E402

SECONDS = 3.0


def rate(call, concurrency: int) -> tuple[float, float]:
    """(requests per second, median latency in us) of `call` from `concurrency` threads."""
    latencies: list[float] = []
    stop = time.perf_counter() + SECONDS
    lock = threading.Lock()

    def worker():
        mine = []
        while time.perf_counter() < stop:
            t = time.perf_counter()
            call()
            mine.append(time.perf_counter() - t)
        with lock:
            latencies.extend(mine)

    for _ in range(50):
        call()
    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    started = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return len(latencies) / (time.perf_counter() - started), statistics.median(latencies) * 1e6


def small(repo: str) -> None:
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient

    from tritonmp import tritonserver

    a = np.ones((1, 3), np.float32)
    rows = []
    with tritonserver.Server(model_repository=repo) as server:
        model = server.model("add")
        for c in (1, 16):
            rows.append(("in-process", c, *rate(lambda: list(model.infer(inputs={"A": a, "B": a})), c)))
    server = Server(repo)
    try:
        for name, module, url in (("http", httpclient, f"127.0.0.1:{server.http}"),
                                  ("grpc", grpcclient, f"127.0.0.1:{server.grpc}")):
            for c in (1, 16):
                local = threading.local()

                def call(module=module, url=url, local=local):
                    if not hasattr(local, "client"):
                        local.client = module.InferenceServerClient(url)
                        local.inputs = [module.InferInput("A", [1, 3], "FP32"), module.InferInput("B", [1, 3], "FP32")]
                        for i in local.inputs:
                            i.set_data_from_numpy(a)
                    local.client.infer("add", local.inputs)

                rows.append((name, c, *rate(call, c)))
    finally:
        server.stop()
    for path, c, rps, med in rows:
        print(f"add model, {path:<10} concurrency {c:>2}: {rps:8.0f} req/s, median {med:7.0f} us")


def large(tmp: str) -> None:
    from tritonmp import tritonserver

    repo, src, memcpy = setup_64mib(tmp)
    with tritonserver.Server(model_repository=repo) as server:
        big = server.model("big")

        def call():
            (response,) = big.infer(inputs={"X": src})
            return np.from_dlpack(response.outputs["Y"])

        assert np.array_equal(call(), src)
        inprocess = median_us(call, 20)
        shared = server.shared_array(src.shape, src.dtype)

        def call_shared():
            (response,) = big.infer(inputs={"X": shared})
            return np.from_dlpack(response.outputs["Y"])

        np.copyto(shared, src)
        assert np.array_equal(call_shared(), src)
        shared_once = median_us(call_shared, 20)

        def call_shared_written():
            np.copyto(shared, src)
            return call_shared()

        shared_written = median_us(call_shared_written, 20)
    shm_us = shm_round_trip_us(repo, src)
    shm_written_us = shm_round_trip_us(repo, src, write_input=True)
    print(f"64 MiB in and out: in-process median {inprocess / 1000:.1f} ms from a numpy array; from a shared array "
          f"(Server.shared_array) {shared_written / 1000:.1f} ms written each request, {shared_once / 1000:.1f} ms "
          f"written once; client shared memory {shm_written_us / 1000:.1f} ms with the input written each request, "
          f"{shm_us / 1000:.1f} ms with it written once; bare 64 MiB memcpy {memcpy / 1000:.1f} ms "
          f"(in-process / memcpy {inprocess / memcpy:.2f})")


def main() -> None:
    tmp = tempfile.mkdtemp(prefix="tritonmp-bench-")
    try:
        repo = os.path.join(tmp, "example")
        write(binary_op_model("Add"), os.path.join(repo, "add", "1", "model.onnx"))
        small(repo)
        large(tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
