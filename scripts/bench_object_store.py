"""Repositories in object storage against the same on local disk: the time from start to ready for N
ONNX models from a local S3-compatible server (moto's, on loopback) and from a local folder, and the
server's memory while it copies one large model file from the store.

    python scripts/bench_object_store.py [--models 20] [--runs 3] [--big-mib 1024]

Needs the cloud and storage-emulators extras (`make test` installs both). Prints the median time to
ready of each, their ratio, and for the large file: its copy time, and the server's resident memory
before, at its peak during the copy (VmHWM), and after.
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
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "configs" / "model_repository"
BUCKET = "bench"
ENV = {"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench-secret", "AWS_DEFAULT_REGION": "us-east-1"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait(url: str, timeout: float, proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise SystemExit(f"the server exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=1) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.01)
    raise SystemExit(f"{url} did not answer within {timeout:g}s")


def _onnx_repository(root: Path, n: int) -> Path:
    """N copies of the example ONNX add model."""
    import make_example_repo

    example = root / "example"
    shutil.copytree(EXAMPLES, example, ignore=shutil.ignore_patterns("*.onnx"))
    make_example_repo.main(str(example))
    repo = root / "onnx"
    for i in range(n):
        name = f"add_{i:02d}"
        shutil.copytree(example / "add", repo / name)
        config = repo / name / "config.pbtxt"
        config.write_text(config.read_text().replace('name: "add"', f'name: "{name}"'))
    return repo


def _serve(repo: str, *args: str) -> tuple[subprocess.Popen, int]:
    http = _free_port()
    cmd = [sys.executable, "-m", "tritonmp", "--model-repository", repo, "--http-port", str(http),
           "--grpc-port", str(_free_port()), "--metrics-port", str(_free_port()), *args]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=dict(os.environ, **ENV),
                            start_new_session=True)
    return proc, http


def _stop(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def _time_to_ready(repo: str) -> float:
    started = time.monotonic()
    proc, http = _serve(repo)
    try:
        _wait(f"http://127.0.0.1:{http}/v2/health/ready", 300, proc)
        return time.monotonic() - started
    finally:
        _stop(proc)


def _memory(pid: int, field: str) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return 0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", type=int, default=20)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--big-mib", type=int, default=1024)
    args = p.parse_args()
    import boto3

    sys.path.insert(0, str(ROOT / "scripts"))
    work = Path(tempfile.mkdtemp(prefix="tritonmp-bench-store-"))
    port = _free_port()
    moto = subprocess.Popen([os.path.join(os.path.dirname(sys.executable), "moto_server"), "-H", "127.0.0.1",
                             "-p", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait(f"http://127.0.0.1:{port}/moto-api/", 60)
        s3 = boto3.client("s3", endpoint_url=f"http://127.0.0.1:{port}", **{
            "aws_access_key_id": ENV["AWS_ACCESS_KEY_ID"], "aws_secret_access_key": ENV["AWS_SECRET_ACCESS_KEY"],
            "region_name": "us-east-1"})
        s3.create_bucket(Bucket=BUCKET)
        local = _onnx_repository(work, args.models)
        for path in sorted(local.rglob("*")):
            if path.is_file():
                s3.upload_file(str(path), BUCKET, f"onnx/{path.relative_to(local).as_posix()}")
        remote = f"s3://127.0.0.1:{port}/{BUCKET}/onnx"
        times: dict[str, list[float]] = {"local": [], "s3": []}
        for _ in range(args.runs):
            times["local"].append(_time_to_ready(str(local)))
            times["s3"].append(_time_to_ready(remote))
        local_s, s3_s = statistics.median(times["local"]), statistics.median(times["s3"])
        print(f"{args.models} ONNX models, time to ready (median of {args.runs}): local folder {local_s:.2f} s, "
              f"S3-compatible server {s3_s:.2f} s, ratio {s3_s / local_s:.2f}")

        big = work / "big"
        (big / "big" / "1").mkdir(parents=True)
        shutil.copy(EXAMPLES / "add_py" / "1" / "model.py", big / "big" / "1" / "model.py")
        config = (EXAMPLES / "add_py" / "config.pbtxt").read_text().replace('name: "add_py"', 'name: "big"')
        (big / "big" / "config.pbtxt").write_text(config)
        weights = big / "big" / "1" / "weights.bin"
        with open(weights, "wb") as f:
            for _ in range(args.big_mib):
                f.write(os.urandom(1 << 20))
        for path in sorted(big.rglob("*")):
            if path.is_file():
                s3.upload_file(str(path), BUCKET, f"big/{path.relative_to(big).as_posix()}")
        weights.unlink()
        proc, http = _serve(f"s3://127.0.0.1:{port}/{BUCKET}/big", "--model-control-mode=explicit")
        try:
            _wait(f"http://127.0.0.1:{http}/v2/health/ready", 120, proc)
            before = _memory(proc.pid, "VmRSS")
            started = time.monotonic()
            request = urllib.request.Request(f"http://127.0.0.1:{http}/v2/repository/models/big/load", data=b"",
                                             method="POST")
            with urllib.request.urlopen(request, timeout=600) as r:
                assert r.status == 200
            took = time.monotonic() - started
            peak, after = _memory(proc.pid, "VmHWM"), _memory(proc.pid, "VmRSS")
        finally:
            _stop(proc)
        print(f"a {args.big_mib} MiB model file: loaded in {took:.2f} s ({args.big_mib / took:.0f} MiB/s); the "
              f"server's resident memory {before >> 20} MiB before, {peak >> 20} MiB at its peak, "
              f"{after >> 20} MiB after")
    finally:
        moto.terminate()
        moto.wait()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
