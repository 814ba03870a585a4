"""A python model's load time in its own environment (EXECUTION_ENV_PATH) against the same model in the
server's own interpreter: loaded through the repository API of one server (explicit model control),
unloaded between loads.

    python scripts/bench_python_envs.py [--runs 5] [--instances 1]

Builds a virtual environment of the server's Python with its numpy (uv, of the test extra), and a
venv-pack style archive of it, then times, per model, `POST /v2/repository/models/M/load`:
- own: the server's interpreter (workers forked from the python template);
- directory: the environment used in place (workers exec'd in its interpreter);
- archive, first load: unpacked into an empty --python-env-cache, then probed;
- archive, cached: loaded again in the same server (nothing unpacked or probed);
- archive, new server: a second server on the same cache (the copy reused, the environment probed).
Prints the median of each over the runs and its ratio to `own`. Triton is not run beside it: its
python backend needs a stub built for the environment's Python, which a CPU container of Triton 2.51
does not ship for this one.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.request
from pathlib import Path

MODEL = '''
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("Y", pb_utils.get_input_tensor_by_name(r, "X").as_numpy())])
                for r in requests]
'''
CONFIG = ('backend: "python"\nmax_batch_size: 0\ninstance_group [ {{ count: {instances}, kind: KIND_CPU }} ]\n'
          'input [ {{ name: "X", data_type: TYPE_FP32, dims: [ -1 ] }} ]\n'
          'output [ {{ name: "Y", data_type: TYPE_FP32, dims: [ -1 ] }} ]\n')


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _post(port: int, path: str) -> None:
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=b"", method="POST")
    with urllib.request.urlopen(request, timeout=300) as r:
        if r.status != 200:
            raise SystemExit(f"{path}: HTTP {r.status}")


class Server:
    def __init__(self, repo: Path, cache: Path, log: Path):
        self.port = _free_port()
        self.log = open(log, "wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tritonmp", "--model-repository", str(repo), "--http-port", str(self.port),
             "--grpc-port", str(_free_port()), "--metrics-port", str(_free_port()), "--model-control-mode=explicit",
             f"--python-env-cache={cache}"], stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/v2/health/live", timeout=1):
                    return
            except OSError:
                time.sleep(0.05)
        raise SystemExit("the server did not start")

    def load_seconds(self, model: str) -> float:
        start = time.perf_counter()
        _post(self.port, f"/v2/repository/models/{model}/load")
        took = time.perf_counter() - start
        _post(self.port, f"/v2/repository/models/{model}/unload")
        return took

    def stop(self) -> None:
        os.killpg(self.proc.pid, signal.SIGTERM)
        self.proc.wait(60)
        self.log.close()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--instances", type=int, default=1)
    args = p.parse_args()
    import numpy

    uv = os.path.join(os.path.dirname(sys.executable), "uv")
    work = Path(tempfile.mkdtemp(prefix="bench-python-envs-"))
    try:
        env = work / "env"
        subprocess.run([uv, "venv", "-q", "--python", sys.executable, str(env)], check=True)
        subprocess.run([uv, "pip", "install", "-q", "--python", str(env / "bin" / "python"),
                        f"numpy=={numpy.__version__}"], check=True)
        repo = work / "models"
        models = (("own", ""), ("directory", str(env)), ("archive", "$$TRITON_MODEL_DIRECTORY/env.tar.gz"))
        for name, env_path in models:
            (repo / name / "1").mkdir(parents=True)
            (repo / name / "1" / "model.py").write_text(MODEL)
            parameter = f'parameters {{ key: "EXECUTION_ENV_PATH" value {{ string_value: "{env_path}" }} }}\n'
            (repo / name / "config.pbtxt").write_text(CONFIG.format(instances=args.instances)
                                                      + (parameter if env_path else ""))
        with tarfile.open(repo / "archive" / "env.tar.gz", "w:gz", compresslevel=1) as tar:
            for entry in sorted(env.iterdir()):
                tar.add(entry, arcname=entry.name)
        size = (repo / "archive" / "env.tar.gz").stat().st_size
        times: dict[str, list[float]] = {k: [] for k in ("own", "directory", "archive, first load",
                                                         "archive, cached", "archive, new server")}
        for run in range(args.runs):
            cache = work / f"cache{run}"
            server = Server(repo, cache, work / f"server{run}.log")
            try:
                times["own"].append(server.load_seconds("own"))
                times["directory"].append(server.load_seconds("directory"))
                times["archive, first load"].append(server.load_seconds("archive"))
                times["archive, cached"].append(server.load_seconds("archive"))
            finally:
                server.stop()
            server = Server(repo, cache, work / f"server{run}b.log")
            try:
                times["archive, new server"].append(server.load_seconds("archive"))
            finally:
                server.stop()
        own = statistics.median(times["own"])
        print(f"python model load time, {args.instances} instance(s), medians of {args.runs} runs; "
              f"archive {size / 2**20:.1f} MiB (numpy {numpy.__version__})")
        print(f"{'load':24} | {'seconds':>8} | {'vs own':>7}")
        for what, values in times.items():
            median = statistics.median(values)
            print(f"{what:24} | {median:8.3f} | {median / own:7.2f}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
