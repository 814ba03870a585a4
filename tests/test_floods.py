"""One hostile client beside legitimate ones: each attack of tests/hostile_clients.py runs for a few
seconds from a process of its own while clients send inference requests over HTTP and gRPC at 20
a second each and a probe asks /v2/health/live every 50 ms. None of the legitimate requests may
fail, their p99 stays under 250 ms, health answers within 100 ms, and the server's processes grow
by no more than the attack's memory bound."""

from __future__ import annotations

import gc
import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

import procfs
from conftest import add_inputs, http_request, serving

HERE = Path(__file__).parent
ATTACK_SECONDS = 2.0
RATE = 20.0  # legitimate requests a second, per protocol


def tree_rss_mib(pid: int) -> float:
    """The resident memory of a process and all its descendants."""
    total, todo = 0.0, [pid]
    while todo:
        p = todo.pop()
        try:
            total += procfs.rss_bytes(p) / (1 << 20)
            todo += procfs.children(p)
        except (FileNotFoundError, ProcessLookupError):
            continue
    return total


class LegitLoad:
    """HTTP and gRPC clients at RATE requests a second each, a health probe every 50 ms, and the
    server tree's memory sampled every 100 ms, each in a thread, until stopped."""

    def __init__(self, server):
        self.server = server
        self.stop = threading.Event()
        self.latencies: dict[str, list[float]] = {"http": [], "grpc": [], "health": []}
        self.due = {"http": 0, "grpc": 0}
        self.failures: list[str] = []
        self.rss_base = tree_rss_mib(server.pid)
        self.rss_peak = self.rss_base
        self.threads = [threading.Thread(target=t, daemon=True)
                        for t in (self._http, self._grpc, self._health, self._memory)]

    def _paced(self, kind: str, call) -> None:
        start = time.perf_counter()
        k = 0
        while not self.stop.is_set():
            k += 1
            wait = start + k / RATE - time.perf_counter()
            if wait > 0 and self.stop.wait(wait):
                break
            self.due[kind] = k
            t0 = time.perf_counter()
            try:
                call()
            except Exception as e:  # noqa: BLE001 - every failure is counted and reported
                self.failures.append(f"{kind}: {e!r}")
                continue
            self.latencies[kind].append(time.perf_counter() - t0)

    def _http(self) -> None:
        client = httpclient.InferenceServerClient(self.server.url, connection_timeout=10, network_timeout=10)
        a = np.ones((1, 3), np.float32)

        def call():
            out = client.infer("add", add_inputs(httpclient, a)).as_numpy("C")
            assert out.tolist() == [[2.0, 2.0, 2.0]], out

        self._paced("http", call)

    def _grpc(self) -> None:
        client = grpcclient.InferenceServerClient(self.server.grpc_url)
        a = np.ones((1, 3), np.float32)

        def call():
            out = client.infer("add", add_inputs(grpcclient, a), client_timeout=10).as_numpy("C")
            assert out.tolist() == [[2.0, 2.0, 2.0]], out

        self._paced("grpc", call)

    def _health(self) -> None:
        while not self.stop.wait(0.05):
            t0 = time.perf_counter()
            try:
                status = http_request(self.server.http_port, "GET", "/v2/health/live", timeout=10)[0]
                assert status == 200, status
            except Exception as e:  # noqa: BLE001
                self.failures.append(f"health: {e!r}")
                continue
            self.latencies["health"].append(time.perf_counter() - t0)

    def _memory(self) -> None:
        while not self.stop.wait(0.1):
            self.rss_peak = max(self.rss_peak, tree_rss_mib(self.server.pid))

    def __enter__(self):
        # a collection of this process's large heap (the whole suite's) would pause every measuring
        # thread at once, and read as the server's stall: none runs while the clients measure
        gc.collect()
        gc.disable()
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        gc.enable()
        for t in self.threads:
            t.join(30)
        assert not any(t.is_alive() for t in self.threads), "a legitimate client hung"

    def p99(self, kind: str) -> float:
        values = sorted(self.latencies[kind])
        return values[min(len(values) - 1, int(len(values) * 0.99))] if values else float("inf")


@pytest.fixture(scope="module")
def server(example_repo, tmp_path_factory):
    with serving([example_repo], [], tmp_path_factory) as s:
        yield s


def _attack(server, name: str, seconds: float = ATTACK_SECONDS) -> dict:
    proc = subprocess.run([sys.executable, str(HERE / "hostile_clients.py"), name, "127.0.0.1", str(server.http_port),
                           str(server.grpc_port), str(seconds)], capture_output=True, text=True, timeout=seconds + 60)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


# attack, the growth of the server's memory allowed (MiB), and what the server must have done to it
ATTACKS = [
    ("settings-window", 100, "GOAWAY"),
    ("continuation", 100, "GOAWAY ENHANCE_YOUR_CALM"),
    ("rapid-reset", 100, "GOAWAY ENHANCE_YOUR_CALM"),
    ("hpack-bomb", 100, "GOAWAY"),
    ("ping-flood", 100, "connection ended"),
    ("http-huge-header", 100, "HTTP/1.1 431"),
    ("grpc-gzip-bomb", 300, "13: Unable to parse request|8: Received message larger than max"),
    ("grpc-huge-prefix", 300, "8: Received message larger than max (4294967295 vs. 2147483647)"),
]


def _answered(tally: dict, answer: str) -> bool:
    """Whether the server did to the attack what `answer` says (every part of it, split on |)."""
    if answer.startswith("GOAWAY"):
        return bool(tally["goaway"]) and (not answer.endswith("CALM") or "0xb" in tally["goaway"])
    if answer == "connection ended":
        return tally["connections"] > 1
    if answer.startswith("HTTP/1.1"):
        return any(k.startswith(answer) for k in tally["goaway"])
    return all(any(a.startswith(part) for a in tally["answers"]) for part in answer.split("|"))


@pytest.mark.slow
@pytest.mark.parametrize("name,memory_mib,answer", ATTACKS, ids=[a[0] for a in ATTACKS])
def test_one_hostile_client_does_not_stall_the_others(server, name, memory_mib, answer):
    with LegitLoad(server) as load:
        time.sleep(0.3)  # the legitimate clients are connected and warm
        tally = _attack(server, name)
        time.sleep(0.2)
    summary = {kind: f"p99 {load.p99(kind) * 1000:.0f} ms of {len(v)}" for kind, v in load.latencies.items()}
    print(f"{name}: {tally}; legit {summary}; rss {load.rss_base:.0f} -> peak {load.rss_peak:.0f} MiB")
    assert not load.failures, load.failures[:5]
    for kind in ("http", "grpc"):
        assert len(load.latencies[kind]) >= 0.9 * load.due[kind], (kind, len(load.latencies[kind]), load.due[kind])
        assert load.p99(kind) < 0.25, (kind, summary)
    assert max(load.latencies["health"]) < 0.1, summary
    assert load.rss_peak - load.rss_base < memory_mib
    assert _answered(tally, answer), (answer, tally)
    assert server.get("/v2/health/ready")[0] == 200
