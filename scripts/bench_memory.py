"""Memory and start time per model: for N python models and N ONNX models (one instance each),
the time from start to ready and the PSS of the server's whole process tree, for tritonmp and,
side by side in the same run, the reference Triton server (python models; its ONNX backend is not
installed here).

    python scripts/bench_memory.py [--python 20 60] [--onnx 20] [--torch 1 4] [--no-triton]
                                   [--worker-start fork|exec]
    python scripts/bench_memory.py --walk 1000 --resident 50

Needs the reference server from ../shared/anchors/setup.sh (ANCHORS_SETUP, ANCHORS_DIR) unless
--no-triton. Prints one row per run: the PSS of the whole tree and its anonymous part, and the mean
PSS of one worker process (a python stub, for Triton).
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
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "configs" / "model_repository"
ANCHORS = Path(os.environ.get("ANCHORS_DIR", Path.home() / ".cache" / "tritonmp-anchors"))


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


TORCH_CONFIG = """name: "{name}"
platform: "pytorch_libtorch"
max_batch_size: 8
input [ {{ name: "INPUT__0", data_type: TYPE_FP32, dims: [ 3 ] }},
        {{ name: "INPUT__1", data_type: TYPE_FP32, dims: [ 3 ] }} ]
output [ {{ name: "OUTPUT__0", data_type: TYPE_FP32, dims: [ 3 ] }} ]
instance_group [ {{ count: 1, kind: KIND_CPU }} ]
"""


def _torch_repository(root: Path, n: int) -> Path:
    """N TorchScript models that add their inputs."""
    import warnings

    import torch

    class Add(torch.nn.Module):
        def forward(self, a, b):
            return a + b

    repo = root / f"torch_{n}"
    for i in range(n):
        model = repo / f"add_pt_{i}"
        (model / "1").mkdir(parents=True)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.jit.script(Add()).save(str(model / "1" / "model.pt"))
        (model / "config.pbtxt").write_text(TORCH_CONFIG.format(name=f"add_pt_{i}"))
    return repo


def _repository(root: Path, kind: str, n: int) -> Path:
    """N copies of the example add model: add_py (python) or add (ONNX); or N TorchScript models."""
    if kind == "torch":
        return _torch_repository(root, n)
    repo = root / f"{kind}_{n}"
    source = EXAMPLES / ("add_py" if kind == "python" else "add")
    for i in range(n):
        name = f"{source.name}_{i}"
        shutil.copytree(source, repo / name)
        config = repo / name / "config.pbtxt"
        text = config.read_text()
        if kind == "python":
            text = text.replace('name: "add_py"', f'name: "{name}"')
        else:
            text = text.replace('name: "add"', f'name: "{name}"')
        config.write_text(text)
    return repo


def _tree(pid: int) -> list[tuple[int, bool]]:
    """The process tree under `pid`: (pid, whether it is a worker) for each. A worker is a process
    that runs a model: a child of the server that is not a template, or a template's child."""
    tree, frontier = [(pid, False)], [pid]
    while frontier:
        parent = frontier.pop()
        try:
            kids = [int(k) for k in Path(f"/proc/{parent}/task/{parent}/children").read_text().split()]
        except OSError:
            continue
        for kid in kids:
            try:
                template = b"tritonmp.workers.template" in Path(f"/proc/{kid}/cmdline").read_bytes()
            except OSError:
                template = False
            tree.append((kid, parent != pid or not template))
            frontier.append(kid)
    return tree


def _pss_kib(pid: int) -> tuple[int, int]:
    """(PSS, its anonymous part) of one process, in KiB."""
    pss = anon = 0
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                pss = int(line.split()[1])
            elif line.startswith("Pss_Anon:"):
                anon = int(line.split()[1])
    except OSError:
        pass
    return pss, anon


def _ready(port: int, proc: subprocess.Popen, timeout: float) -> float:
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/health/ready", timeout=1) as r:
                if r.status == 200:
                    return time.monotonic()
        except OSError:
            pass
        time.sleep(0.05)
    raise RuntimeError("server did not become ready")


def measure(command: list[str], http: int, log: Path, settle: float) -> tuple[float, int, int, int, float]:
    """(seconds to ready, total PSS MiB, anonymous PSS MiB, processes, a worker's mean PSS MiB) of one
    server."""
    with open(log, "wb") as out:
        started = time.monotonic()
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            ready = _ready(http, proc, 600) - started
            time.sleep(settle)  # let start-up garbage be freed before reading memory
            tree = _tree(proc.pid)
            pss = [_pss_kib(p) for p, _ in tree]
            workers = [p for (p, _), (_, worker) in zip(pss, tree) if worker]
            mean = sum(workers) / len(workers) / 1024 if workers else 0.0
            return ready, sum(p for p, _ in pss) // 1024, sum(a for _, a in pss) // 1024, len(tree), mean
        finally:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


ADD_BODY = (b'{"inputs":[{"name":"A","shape":[1,3],"datatype":"FP32","data":[1,2,3]},'
            b'{"name":"B","shape":[1,3],"datatype":"FP32","data":[1,1,1]}]}')


def walk(root: Path, n: int, resident: int, settle: float) -> None:
    """N python models served with --load-on-demand --max-resident-models RESIDENT: one request to
    each in turn, timed (each is the model's first), and the tree's PSS as the walk goes."""
    repo = _repository(root, "python", n)
    http, grpc, metrics = _free_ports(3)
    command = [sys.executable, "-m", "tritonmp", "--model-repository", str(repo), "--http-port", str(http),
               "--grpc-port", str(grpc), "--metrics-port", str(metrics), "--load-on-demand",
               "--max-resident-models", str(resident)]
    with open(root / "walk.log", "wb") as out:
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            _ready(http, proc, 600)
            print(f"walk: {n} python models, at most {resident} resident")
            print(f"{'models walked':>14} {'PSS MiB':>8} {'procs':>6} {'first request ms: p50':>22} {'max':>7}")
            latencies: list[float] = []
            for i in range(n):
                request = urllib.request.Request(f"http://127.0.0.1:{http}/v2/models/add_py_{i}/infer", ADD_BODY,
                                                 method="POST")
                started = time.monotonic()
                with urllib.request.urlopen(request, timeout=120) as r:
                    r.read()
                latencies.append((time.monotonic() - started) * 1000)
                if (i + 1) % max(1, n // 10) == 0 or i + 1 == n:
                    tree = _tree(proc.pid)
                    pss = sum(_pss_kib(p)[0] for p, _ in tree) // 1024
                    ordered = sorted(latencies)
                    print(f"{i + 1:>14} {pss:>8} {len(tree):>6} {ordered[len(ordered) // 2]:>22.1f} "
                          f"{ordered[-1]:>7.1f}", flush=True)
        finally:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", type=int, nargs="*", default=[20, 60], help="numbers of python models")
    parser.add_argument("--onnx", type=int, nargs="*", default=[20], help="numbers of ONNX models")
    parser.add_argument("--torch", type=int, nargs="*", default=[], help="numbers of TorchScript models")
    parser.add_argument("--walk", type=int, default=0, metavar="N",
                        help="instead: walk N python models loaded on demand (see --resident)")
    parser.add_argument("--resident", type=int, default=50, help="--max-resident-models for --walk")
    parser.add_argument("--no-triton", action="store_true", help="tritonmp only")
    parser.add_argument("--worker-start", default="", help="tritonmp's --worker-start (default: its own)")
    parser.add_argument("--settle", type=float, default=2.0, help="seconds between ready and the reading")
    args = parser.parse_args()
    reference = ANCHORS / "bin" / "tritonserver-ref"
    if args.walk:
        with tempfile.TemporaryDirectory() as tmp:
            walk(Path(tmp), args.walk, args.resident, args.settle)
        return 0
    if not args.no_triton:
        setup = os.environ.get("ANCHORS_SETUP", str(ROOT.parent / "shared" / "anchors" / "setup.sh"))
        subprocess.run(["bash", setup, str(ANCHORS)], check=True, stdout=subprocess.DEVNULL)
    if not (EXAMPLES / "add" / "1" / "model.onnx").exists():
        subprocess.run([sys.executable, str(ROOT / "scripts" / "make_example_repo.py"), str(EXAMPLES)], check=True)
    print(f"{'server':<10} {'models':<12} {'ready s':>8} {'PSS MiB':>8} {'anon MiB':>9} {'procs':>6} "
          f"{'MiB/model':>10} {'worker MiB':>11}")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        runs = [("python", n) for n in args.python] + [("onnx", n) for n in args.onnx] + \
            [("torch", n) for n in args.torch]
        for kind, n in runs:
            repo = _repository(root, kind, n)
            http, grpc, metrics = _free_ports(3)
            ours = [sys.executable, "-m", "tritonmp", "--model-repository", str(repo), "--http-port", str(http),
                    "--grpc-port", str(grpc), "--metrics-port", str(metrics)]
            if args.worker_start:
                ours += ["--worker-start", args.worker_start]
            servers = [("tritonmp", ours)]
            if kind == "python" and not args.no_triton:
                servers.append(("triton", [str(reference), "--model-repository", str(repo), "--http-port", str(http),
                                           "--grpc-port", str(grpc), "--metrics-port", str(metrics)]))
            for name, command in servers:
                ready, pss, anon, procs, worker = measure(command, http, root / f"{name}.log", args.settle)
                print(f"{name:<10} {f'{n} {kind}':<12} {ready:>8.2f} {pss:>8} {anon:>9} {procs:>6} "
                      f"{pss / n:>10.1f} {worker:>11.1f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
