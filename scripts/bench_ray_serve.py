"""What Ray Serve's proxy costs in front of tritonmp: the same requests to the `tritonmp` command's
HTTP port and to a one-replica `tritonmp.ray_serve` deployment behind Serve's HTTP proxy, on a
one-node Ray cluster on this machine, in the same run.

    python scripts/bench_ray_serve.py [--requests 2000] [--concurrency 8] [--large-mib 16]
                                      [--large-requests 20]

Reports, for each: small requests (add_py, 3 floats) one at a time (p50 and p99 latency) and
`--concurrency` at a time (requests a second), and a large tensor (`--large-mib` MiB each way
through a python model that doubles it) one at a time; then Serve's figure over the command's.
Also the time the cluster took to start and the deployment to be ready. Needs `tritonmp[ray]`.
"""

from __future__ import annotations

import argparse
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


def add_inputs() -> list:
    inputs = []
    for name in ("A", "B"):
        t = httpclient.InferInput(name, [1, 3], "FP32")
        t.set_data_from_numpy(np.ones((1, 3), np.float32), binary_data=True)
        inputs.append(t)
    return inputs


def measure(url: str, args) -> dict[str, float]:
    c = httpclient.InferenceServerClient(url, network_timeout=120, concurrency=1)
    inputs = add_inputs()
    for _ in range(50):  # loads the models, warms the paths
        c.infer("add_py", inputs)
    latencies = []
    for _ in range(args.requests):
        started = time.perf_counter()
        c.infer("add_py", inputs)
        latencies.append(time.perf_counter() - started)
    latencies.sort()
    done = [0]

    def client() -> None:
        own = httpclient.InferenceServerClient(url, network_timeout=120)
        own_inputs = add_inputs()
        for _ in range(args.requests // args.concurrency):
            own.infer("add_py", own_inputs)
            done[0] += 1
        own.close()

    threads = [threading.Thread(target=client) for _ in range(args.concurrency)]
    started = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    throughput = done[0] / (time.perf_counter() - started)
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
    return {"p50_ms": latencies[len(latencies) // 2] * 1e3, "p99_ms": latencies[int(len(latencies) * 0.99)] * 1e3,
            "rps": throughput, "large_ms": sorted(large)[len(large) // 2] * 1e3}


def direct(repo: Path, args) -> dict[str, float]:
    http, grpc, metrics = free_ports(3)
    proc = subprocess.Popen([sys.executable, "-m", "tritonmp", "--model-repository", str(repo),
                             "--http-port", str(http), "--grpc-port", str(grpc), "--metrics-port", str(metrics)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_ready(f"127.0.0.1:{http}")
        return measure(f"127.0.0.1:{http}", args)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)


def on_serve(repo: Path, args) -> dict[str, float]:
    import ray
    from ray import serve

    from tritonmp.ray_serve import deployment

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
        result = measure(f"127.0.0.1:{http}", args)
        return {**result, "cluster_s": cluster_s, "deploy_s": deploy_s}
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
    print(f"{'':24}{'tritonmp':>12}{'Ray Serve':>12}{'ratio':>8}")
    for key, label in (("p50_ms", "small p50 (ms)"), ("p99_ms", "small p99 (ms)"),
                       ("rps", f"small x{args.concurrency} (req/s)"), ("large_ms", f"{args.large_mib} MiB (ms)")):
        print(f"{label:24}{base[key]:12.2f}{served[key]:12.2f}{served[key] / base[key]:8.2f}")


if __name__ == "__main__":
    main()
