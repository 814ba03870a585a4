"""What Ray Serve's proxy costs in front of tritonmp: the same requests to the `tritonmp` command's
HTTP port and to a one-replica `tritonmp.ray_serve` deployment behind Serve's HTTP proxy, on a
one-node Ray cluster on this machine, in the same run.

    python scripts/bench_ray_serve.py [--requests 2000] [--concurrency 8] [--large-mib 16]
                                      [--large-requests 20]

Reports, for each: small requests (add_py, 3 floats, JSON over HTTP/1.1 keep-alive) one at a time
(p50 and p99 latency) and `--concurrency` at a time (requests a second), and a large tensor (`--large-mib` MiB each way
through a python model that doubles it) one at a time; then Serve's figure over the command's.
Beside them, the small requests to a Serve deployment that answers at once without any model: what
Serve's proxy costs by itself. Also the time the cluster took to start and the deployment to be
ready. Needs `tritonmp[ray]`.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np
import tritonclient.http as httpclient

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "configs" / "model_repository"
RAY = str(Path(sys.executable).with_name("ray"))
DOUBLE_PY = '''
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("Y", r.inputs()[0].as_numpy() * 2)]) for r in requests]
'''
DOUBLE_CONFIG = ('backend: "python"\nmax_batch_size: 0\n'
                 'input [ { name: "X", data_type: TYPE_FP32, dims: [ -1 ] } ]\n'
                 'output [ { name: "Y", data_type: TYPE_FP32, dims: [ -1 ] } ]\n')


def free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def make_repo(root: Path) -> Path:
    repo = root / "repo"
    shutil.copytree(EXAMPLES / "add_py", repo / "add_py")
    (repo / "double" / "1").mkdir(parents=True)
    (repo / "double" / "1" / "model.py").write_text(DOUBLE_PY)
    (repo / "double" / "config.pbtxt").write_text(DOUBLE_CONFIG)
    return repo


def wait_ready(url: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://{url}/v2/health/ready", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{url} was not ready in {timeout}s")


SMALL_BODY = json.dumps({"inputs": [{"name": n, "shape": [1, 3], "datatype": "FP32", "data": [1.0, 1.0, 1.0]}
                                     for n in ("A", "B")]}).encode()


def post_small(conn: http.client.HTTPConnection) -> None:
    conn.request("POST", "/v2/models/add_py/infer", SMALL_BODY, {"Content-Type": "application/json"})
    response = conn.getresponse()
    body = response.read()
    if response.status != 200:
        raise RuntimeError(f"{response.status}: {body[:200]!r}")


def measure_small(port: int, args) -> dict[str, float]:
    """add_py over plain HTTP/1.1 keep-alive (so that an empty Serve deployment can answer the same)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    for _ in range(50):  # loads the model, warms the paths
        post_small(conn)
    latencies = []
    for _ in range(args.requests):
        started = time.perf_counter()
        post_small(conn)
        latencies.append(time.perf_counter() - started)
    conn.close()
    latencies.sort()
    done = [0]

    def client() -> None:
        own = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        for _ in range(args.requests // args.concurrency):
            post_small(own)
            done[0] += 1
        own.close()

    threads = [threading.Thread(target=client) for _ in range(args.concurrency)]
    started = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return {"p50_ms": latencies[len(latencies) // 2] * 1e3, "p99_ms": latencies[int(len(latencies) * 0.99)] * 1e3,
            "rps": done[0] / (time.perf_counter() - started)}


def measure(port: int, args) -> dict[str, float]:
    result = measure_small(port, args)
    c = httpclient.InferenceServerClient(f"127.0.0.1:{port}", network_timeout=120)
    big = np.ones(args.large_mib << 18, np.float32)
    x = httpclient.InferInput("X", list(big.shape), "FP32")
    x.set_data_from_numpy(big, binary_data=True)
    c.infer("double", [x])
    large = []
    for _ in range(args.large_requests):
        started = time.perf_counter()
        c.infer("double", [x])
        large.append(time.perf_counter() - started)
    c.close()
    return {**result, "large_ms": sorted(large)[len(large) // 2] * 1e3}


def direct(repo: Path, args) -> dict[str, float]:
    http, grpc, metrics = free_ports(3)
    proc = subprocess.Popen([sys.executable, "-m", "tritonmp", "--model-repository", str(repo),
                             "--http-port", str(http), "--grpc-port", str(grpc), "--metrics-port", str(metrics)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_ready(f"127.0.0.1:{http}")
        return measure(http, args)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)


class Answer:
    """A Serve deployment that answers every request with a fixed body (made a deployment in on_serve)."""

    async def __call__(self, request):
        from starlette.responses import Response

        await request.body()
        return Response(b'{"outputs": []}', media_type="application/json")


def on_serve(repo: Path, args) -> dict[str, float]:
    import ray
    from ray import serve

    from tritonmp.ray_serve import deployment

    global Answer
    Answer = serve.deployment(Answer, max_ongoing_requests=64)  # noqa: PLW0603

    temp = tempfile.mkdtemp(prefix="bray-")
    port, http, client_port = free_ports(3)
    started = time.monotonic()
    head = subprocess.Popen([RAY, "start", "--head", "--block", f"--port={port}", "--node-ip-address=127.0.0.1",
                             "--num-cpus=2", "--include-dashboard=false", "--disable-usage-stats",
                             f"--temp-dir={temp}", f"--ray-client-server-port={client_port}"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if head.poll() is not None or time.monotonic() - started > 120:
                    raise RuntimeError("the Ray head did not start") from None
                time.sleep(0.1)
        ray.init(address=f"127.0.0.1:{port}", log_to_driver=False, logging_level="WARNING")
        serve.start(http_options={"host": "127.0.0.1", "port": http}, proxy_location="HeadOnly")
        cluster_s = time.monotonic() - started
        started = time.monotonic()
        serve.run(deployment(str(repo), num_replicas=1), name="bench", route_prefix="/")
        deploy_s = time.monotonic() - started
        result = measure(http, args)
        # Serve's own cost: a deployment that answers at once, over the same requests
        serve.delete("bench")
        serve.run(Answer.bind(), name="answer", route_prefix="/")
        empty = measure_small(http, args)
        return {**result, "cluster_s": cluster_s, "deploy_s": deploy_s,
                **{f"empty_{k}": v for k, v in empty.items()}}
    finally:
        try:
            serve.shutdown()
            ray.shutdown()
        finally:
            os.killpg(head.pid, signal.SIGKILL)
            head.wait(30)
            shutil.rmtree(temp, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--large-mib", type=int, default=16)
    parser.add_argument("--large-requests", type=int, default=20)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        repo = make_repo(Path(tmp))
        base = direct(repo, args)
        served = on_serve(repo, args)
    print(f"Ray Serve: cluster started in {served['cluster_s']:.1f}s, deployment ready in {served['deploy_s']:.1f}s")
    print(f"{'':24}{'tritonmp':>12}{'Ray Serve':>12}{'ratio':>8}{'empty Serve':>13}")
    for key, label in (("p50_ms", "small p50 (ms)"), ("p99_ms", "small p99 (ms)"),
                       ("rps", f"small x{args.concurrency} (req/s)"), ("large_ms", f"{args.large_mib} MiB (ms)")):
        empty = served.get(f"empty_{key}")
        print(f"{label:24}{base[key]:12.2f}{served[key]:12.2f}{served[key] / base[key]:8.2f}"
              + (f"{empty:13.2f}" if empty is not None else ""))


if __name__ == "__main__":
    main()
