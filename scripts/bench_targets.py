"""DESIGN.md's performance targets that need no reference server, measured on this machine:

1. ONNX, OpenVINO and TensorFlow: the server's overhead per request over a bare in-process call
   of the same framework on the same add model, concurrency 1 (HTTP and gRPC, median latency minus
   the bare call's median). OpenVINO and TensorFlow are skipped where they are not installed.
2. 64 MiB tensors through client system shared memory (input and output in client regions, an
   ONNX identity model) against a bare 64 MiB memcpy.
3. Cold start of a repository of 20 small ONNX models to ready.

    .venv/bin/python scripts/bench_targets.py
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
from make_example_repo import binary_op_model, write  # noqa: E402


def free_ports(n: int) -> list[int]:
    """n distinct free ports, all held while they are chosen."""
    sockets = [socket.socket() for _ in range(n)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


class Server:
    def __init__(self, repo: str, *args: str):
        self.http, self.grpc, self.metrics = free_ports(3)
        self.started = time.perf_counter()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tritonmp", "--model-repository", repo, "--http-port", str(self.http),
             "--grpc-port", str(self.grpc), "--metrics-port", str(self.metrics), *args],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.http}/v2/health/ready", timeout=1) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if self.proc.poll() is not None:
                raise SystemExit("the server did not start")
            time.sleep(0.01)
        self.ready_after = time.perf_counter() - self.started

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(60)


def median_us(fn, n: int) -> float:
    for _ in range(min(200, n)):
        fn()
    times = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e6


def overhead(label: str, repo: str, model: str, bare: float) -> None:
    """Median latency of the add model `model` at concurrency 1 on both protocols, against `bare`
    (the median of the same framework's own in-process call, in microseconds)."""
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient

    a = np.ones((1, 3), np.float32)
    server = Server(repo)
    try:
        for name, module, url in (("http", httpclient, f"127.0.0.1:{server.http}"),
                                  ("grpc", grpcclient, f"127.0.0.1:{server.grpc}")):
            client = module.InferenceServerClient(url)
            inputs = [module.InferInput("A", [1, 3], "FP32"), module.InferInput("B", [1, 3], "FP32")]
            for i in inputs:
                i.set_data_from_numpy(a)
            took = median_us(lambda c=client, i=inputs: c.infer(model, i), 2000)
            live = median_us(lambda c=client: c.is_server_live(), 2000)
            print(f"{label} add, {name}, concurrency 1: median {took:.0f} us per request; the client's "
                  f"round trip to a trivial health call is {live:.0f} us; bare {label} call {bare:.1f} us")
            print(f"  server overhead over the bare call: {took - bare:.0f} us end to end, "
                  f"{took - live - bare:.0f} us beyond the protocol's own round trip (target < 150 us)")
    finally:
        server.stop()


def onnx_overhead(repo: str) -> None:
    import onnxruntime as ort

    a = np.ones((1, 3), np.float32)
    session = ort.InferenceSession(os.path.join(repo, "add", "1", "model.onnx"), providers=["CPUExecutionProvider"])
    overhead("onnxruntime", repo, "add", median_us(lambda: session.run(["C"], {"A": a, "B": a}), 3000))


def openvino_overhead(tmp: str) -> None:
    try:
        import openvino as ov
    except ImportError:
        print("openvino add: skipped, openvino is not installed (pip install 'tritonmp[openvino]')")
        return
    repo = os.path.join(tmp, "ov")
    write(binary_op_model("Add"), os.path.join(tmp, "add.onnx"))
    os.makedirs(os.path.join(repo, "add_ov", "1"))
    ov.save_model(ov.convert_model(os.path.join(tmp, "add.onnx")), os.path.join(repo, "add_ov", "1", "model.xml"))
    request = ov.Core().compile_model(os.path.join(repo, "add_ov", "1", "model.xml"), "CPU").create_infer_request()
    a = np.ones((1, 3), np.float32)
    bare = median_us(lambda: request.infer({"A": a, "B": a}, share_inputs=True, share_outputs=True), 3000)
    overhead("openvino", repo, "add_ov", bare)


TF_MODEL_AND_BARE_CALL = """
import os, statistics, sys, time
import numpy as np
import tensorflow as tf

class Add(tf.Module):
    @tf.function(input_signature=[tf.TensorSpec([None, 3], tf.float32)] * 2)
    def serve(self, A, B):
        return {"C": A + B}

module = Add()
tf.saved_model.save(module, sys.argv[1], signatures={"serving_default": module.serve})
fn = tf.saved_model.load(sys.argv[1]).signatures["serving_default"]
a = np.ones((1, 3), np.float32)
times = []
for i in range(3200):
    t = time.perf_counter()
    fn(A=tf.constant(a), B=tf.constant(a))["C"].numpy()
    if i >= 200:
        times.append(time.perf_counter() - t)
print(statistics.median(times) * 1e6)
"""


def tensorflow_overhead(tmp: str) -> None:
    import importlib.util

    if importlib.util.find_spec("tensorflow") is None:
        print("tensorflow add: skipped, tensorflow is not installed (pip install 'tritonmp[tensorflow]')")
        return
    # the SavedModel and the bare call in a process of their own: TensorFlow's thread pools in the
    # client's process would slow the client, and so the server's figures
    repo = os.path.join(tmp, "tf")
    path = os.path.join(repo, "add_tf", "1", "model.savedmodel")
    out = subprocess.run([sys.executable, "-c", TF_MODEL_AND_BARE_CALL, path], capture_output=True, text=True,
                         check=True, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    overhead("tensorflow", repo, "add_tf", float(out.stdout.strip().splitlines()[-1]))


def identity_repo(tmp: str, n: int) -> str:
    """A repository with `big`, an ONNX identity model over FP32 [n]."""
    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node("Identity", ["X"], ["Y"])], "identity",
                              [helper.make_tensor_value_info("X", TensorProto.FLOAT, [n])],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [n])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    repo = os.path.join(tmp, "big")
    write(model, os.path.join(repo, "big", "1", "model.onnx"))
    return repo


def shm_round_trip_us(repo: str, src: np.ndarray, write_input: bool = False) -> float:
    """Median microseconds of `big` on `src` with its input and output in client system shared memory;
    with `write_input`, each request also writes its input into the region first (as a program with new
    data for every request does)."""
    import tritonclient.http as httpclient
    import tritonclient.utils.shared_memory as shm

    n = src.size
    server = Server(repo, "--allow-client-shm=true")
    key_in, key_out = f"/bench-in-{os.getpid()}", f"/bench-out-{os.getpid()}"
    h_in = shm.create_shared_memory_region("in", key_in, src.nbytes)
    h_out = shm.create_shared_memory_region("out", key_out, src.nbytes)
    try:
        shm.set_shared_memory_region(h_in, [src])
        client = httpclient.InferenceServerClient(f"127.0.0.1:{server.http}", network_timeout=120)
        client.register_system_shared_memory("in", key_in, src.nbytes)
        client.register_system_shared_memory("out", key_out, src.nbytes)
        x = httpclient.InferInput("X", [n], "FP32")
        x.set_shared_memory("in", src.nbytes)
        y = httpclient.InferRequestedOutput("Y")
        y.set_shared_memory("out", src.nbytes)
        def call():
            if write_input:
                shm.set_shared_memory_region(h_in, [src])
            client.infer("big", [x], outputs=[y])

        took = median_us(call, 20)
        assert np.array_equal(shm.get_contents_as_numpy(h_out, np.float32, [n]), src)
        return took
    finally:
        server.stop()
        shm.destroy_shared_memory_region(h_in)
        shm.destroy_shared_memory_region(h_out)


def setup_64mib(tmp: str) -> tuple[str, np.ndarray, float]:
    """The identity repository over 64 MiB of FP32, a 64 MiB source array, and a bare memcpy's median us."""
    n = 16 * 1024 * 1024
    repo = identity_repo(tmp, n)
    src = np.random.default_rng(0).random(n, dtype=np.float32)
    dst = np.empty_like(src)
    return repo, src, median_us(lambda: np.copyto(dst, src), 20)


def shm_64mib(tmp: str) -> None:
    repo, src, memcpy = setup_64mib(tmp)
    took = shm_round_trip_us(repo, src)
    print(f"64 MiB through client shm (input and output): median {took / 1000:.1f} ms; bare 64 MiB memcpy "
          f"{memcpy / 1000:.1f} ms; ratio {took / memcpy:.2f} (target <= 2; onnxruntime writes the output "
          f"straight into the client region)")


def cold_start(tmp: str) -> None:
    repo = os.path.join(tmp, "twenty")
    model = binary_op_model("Add")
    for i in range(20):
        write(model, os.path.join(repo, f"add{i:02d}", "1", "model.onnx"))
    times = []
    for _ in range(3):
        server = Server(repo)
        times.append(server.ready_after)
        server.stop()
    print(f"cold start of 20 small ONNX models to ready: median {statistics.median(times):.2f} s over 3 starts "
          f"on {os.cpu_count()} cores (target < 5 s)")


def main() -> None:
    tmp = tempfile.mkdtemp(prefix="tritonmp-bench-")
    try:
        repo = os.path.join(tmp, "example")
        write(binary_op_model("Add"), os.path.join(repo, "add", "1", "model.onnx"))
        onnx_overhead(repo)
        openvino_overhead(tmp)
        tensorflow_overhead(tmp)
        shm_64mib(tmp)
        cold_start(tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
