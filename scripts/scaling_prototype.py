"""Prototype measurements behind docs/scaling.md: what each way of spreading the frontend over
several processes costs per request.

    .venv/bin/python scripts/scaling_prototype.py [--seconds 5] [--connections 64] [--replicas 1 2]

1. Replicas on SO_REUSEPORT. N processes, each an in-process `tritonserver.Server` with its own
   model workers and a `KServeHttp` frontend, listen on one port with SO_REUSEPORT, so the kernel
   spreads connections over them. wrk loads the port with the add_py model's JSON request. The
   script prints the total req/s and the frontends' CPU µs per request, summed over the
   replicas; their model workers are not counted.
2. Protocol processes in front of one scheduling process. The price of this option is the hop it
   adds: each request and its answer cross one more socketpair as a small descriptor, with the
   tensors left in shared memory. Two uvloop processes trade 128-byte descriptors over a
   socketpair, with K of them in flight; the script prints each side's CPU µs per round trip.

wrk must be installed (Debian's package).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LUA = """wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.body = '{"inputs":[{"name":"A","shape":[1,3],"datatype":"FP32","data":[1,2,3]},' ..
           '{"name":"B","shape":[1,3],"datatype":"FP32","data":[1,2,3]}]}'
"""
DESCRIPTOR = 128


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# ---- 1. replicas on SO_REUSEPORT -------------------------------------------------------------

def serve_replica(repo: str, port: int) -> None:
    """One replica: an in-process server and its HTTP frontend on the shared port."""
    sys.path.insert(0, str(ROOT))
    from tritonmp import tritonfrontend, tritonserver

    server = tritonserver.Server(model_repository=repo, log_error=True).start(wait_until_ready=True)
    with tritonfrontend.KServeHttp(server, tritonfrontend.KServeHttp.Options(port=port, reuse_port=True)):
        print("ready", flush=True)
        sys.stdin.read()  # until the parent closes it
    server.stop()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def replicas(n: int, seconds: float, connections: int, repo: str, lua: str, threads: int = 1) -> tuple[float, float]:
    port = free_port()
    procs = [subprocess.Popen([sys.executable, __file__, "--serve-replica", repo, str(port)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) for _ in range(n)]
    try:
        for p in procs:
            if p.stdout.readline().strip() != "ready":
                raise SystemExit("a replica did not start")
        url = f"http://127.0.0.1:{port}/v2/models/add_py/infer"
        wrk = ["wrk", f"-t{threads}", "-c", str(connections)]
        subprocess.run([*wrk, "-d1s", "-s", lua, url], capture_output=True, check=True)
        before = [cpu_seconds(p.pid) for p in procs]
        out = subprocess.run([*wrk, f"-d{seconds:g}s", "-s", lua, url], capture_output=True, text=True,
                             check=True).stdout
        used = sum(cpu_seconds(p.pid) for p in procs) - sum(before)
        requests = int(re.search(r"(\d+) requests in", out).group(1))
        return requests / seconds, used / requests * 1e6
    finally:
        for p in procs:
            p.stdin.close()
        for p in procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()


# ---- 2. the hop to a scheduling process -------------------------------------------------------

class Hop(asyncio.Protocol):
    """Reads fixed-size descriptors; `answer` says what to do with each whole one."""

    def __init__(self, answer):
        self.answer = answer
        self.pending = b""

    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        data = self.pending + data
        whole = len(data) // DESCRIPTOR * DESCRIPTOR
        self.pending = data[whole:]
        for i in range(0, whole, DESCRIPTOR):
            self.answer(self.transport, data[i:i + DESCRIPTOR])


def scheduling_side(fd: int) -> None:
    """Answers every descriptor with one of its own, as a scheduling process would answer a
    protocol process once the batch is done."""
    import uvloop

    async def main():
        done = asyncio.get_running_loop().create_future()
        sock = socket.socket(fileno=fd)
        transport, protocol = await asyncio.get_running_loop().connect_accepted_socket(
            lambda: Hop(lambda t, d: t.write(d)), sock)
        protocol.connection_lost = lambda exc: done.set_result(None)
        await done

    uvloop.run(main())


def hop(seconds: float, in_flight: int) -> tuple[float, float, float]:
    import uvloop

    ours, theirs = socket.socketpair()
    child = os.fork()
    if child == 0:
        ours.close()
        try:
            scheduling_side(theirs.detach())
        finally:
            os._exit(0)
    theirs.close()
    count = 0

    async def main():
        nonlocal count
        loop = asyncio.get_running_loop()
        end = loop.time() + seconds
        finished = loop.create_future()

        def again(transport, descriptor):
            nonlocal count
            count += 1
            if loop.time() < end:
                transport.write(descriptor)
            elif not finished.done():
                finished.set_result(None)

        transport, _ = await loop.connect_accepted_socket(lambda: Hop(again), ours)
        started = (cpu_seconds(os.getpid()), cpu_seconds(child))
        for _ in range(in_flight):
            transport.write(bytes(DESCRIPTOR))
        await finished
        used = (cpu_seconds(os.getpid()) - started[0], cpu_seconds(child) - started[1])
        transport.close()
        return used

    used = uvloop.run(main())
    os.waitpid(child, 0)
    return count / seconds, used[0] / count * 1e6, used[1] / count * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=5)
    ap.add_argument("--connections", type=int, default=64)
    ap.add_argument("--replicas", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--wrk-threads", type=int, default=1, help="wrk's threads (one may not keep many replicas busy)")
    ap.add_argument("--in-flight", type=int, nargs="+", default=[1, 16, 64])
    ap.add_argument("--serve-replica", nargs=2, metavar=("REPO", "PORT"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve_replica:
        serve_replica(args.serve_replica[0], int(args.serve_replica[1]))
        return
    print(f"cores: {os.cpu_count()}")
    if shutil.which("wrk") is None:
        print("wrk is not installed (Debian's package wrk): the replica rows are skipped")
    else:
        with tempfile.TemporaryDirectory() as tmp:
            repo = Path(tmp) / "repo"
            shutil.copytree(ROOT / "configs/model_repository/add_py", repo / "add_py")
            lua = Path(tmp) / "add.lua"
            lua.write_text(LUA)
            print(f"1. replicas on SO_REUSEPORT, wrk -t{args.wrk_threads} -c{args.connections}")
            for n in args.replicas:
                rps, us = replicas(n, args.seconds, args.connections, str(repo), str(lua), args.wrk_threads)
                print(f"   {n} replica(s): {rps:8.0f} req/s   frontend CPU {us:5.1f} us/request")
    print("2. the hop to a scheduling process (128-byte descriptors over a socketpair)")
    for k in args.in_flight:
        rate, protocol_us, scheduling_us = hop(args.seconds, k)
        print(f"   {k:3d} in flight: {rate:8.0f} round trips/s   CPU per round trip: protocol side "
              f"{protocol_us:5.1f} us, scheduling side {scheduling_us:5.1f} us")


if __name__ == "__main__":
    main()
