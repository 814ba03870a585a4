"""A real two-node Ray cluster on this machine for the tests: `ray start --head`, then a second
node with `ray start --address`, each in a session of its own and on the loopback address only,
with this test process connected as a driver. `stop()` ends everything they started: the Serve
application, the driver connection, then both nodes' process groups and any process left that
names the cluster's directory."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import procfs
from conftest import POLL_INTERVAL, free_ports, wait_for

RAY = str(Path(sys.executable).with_name("ray"))


def descendants(pid: int) -> set[int]:
    """Every process below `pid` (its children, theirs, ...), read from /proc."""
    found: set[int] = set()
    todo = [pid]
    while todo:
        try:
            children = set(procfs.children(todo.pop()))
        except OSError:
            continue
        todo.extend(children - found)
        found |= children
    return found


alive = procfs.alive

class RayCluster:
    """Two Ray nodes, each with one `tritonmp_slot` resource (a deployment asking for one per
    replica gets a replica on each node), and Serve's HTTP proxy on `http_port`."""

    def __init__(self, env: dict[str, str]):
        self.dir = tempfile.mkdtemp(prefix="tmray-")  # short: Ray's socket paths live under it
        self.port, self.http_port, self.client_port = free_ports(3)
        self.env = {**os.environ, **env, "RAY_USAGE_STATS_ENABLED": "0"}
        self.nodes: list[subprocess.Popen] = []
        self.logs: list[Path] = []
        self.connected = False

    def _node(self, *args: str) -> None:
        log = Path(self.dir) / f"node{len(self.nodes)}.log"
        self.logs.append(log)
        with open(log, "wb") as out:
            self.nodes.append(subprocess.Popen(
                [RAY, "start", "--block", "--node-ip-address=127.0.0.1", "--num-cpus=2",
                 '--resources={"tritonmp_slot": 1}', "--disable-usage-stats", *args],
                stdout=out, stderr=subprocess.STDOUT, env=self.env, start_new_session=True))

    def _accepting(self) -> bool:
        self._check_nodes()
        try:
            socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
            return True
        except OSError:
            return False

    def _check_nodes(self) -> None:
        for node, log in zip(self.nodes, self.logs):
            if node.poll() is not None:
                raise RuntimeError(f"a Ray node exited ({node.returncode}):\n{log.read_text()[-3000:]}")

    def start(self) -> RayCluster:
        import ray
        from ray import serve

        self._node("--head", f"--port={self.port}", f"--temp-dir={self.dir}", "--include-dashboard=false",
                   f"--ray-client-server-port={self.client_port}")
        # the second node starts beside the head and joins once the head's GCS answers
        self._node(f"--address=127.0.0.1:{self.port}")
        wait_for(self._accepting, 90, "the Ray head node")
        ray.init(address=f"127.0.0.1:{self.port}", log_to_driver=False, logging_level="WARNING")
        self.connected = True

        def both_nodes() -> bool:
            self._check_nodes()
            return sum(1 for n in ray.nodes() if n["Alive"]) == 2

        wait_for(both_nodes, 90, "the second Ray node")
        serve.start(http_options={"host": "127.0.0.1", "port": self.http_port}, proxy_location="HeadOnly")
        return self

    def stop(self) -> None:
        if self.connected:
            import ray
            from ray import serve

            try:
                serve.shutdown()  # replicas stop gracefully: their servers' workers finish and exit
            finally:
                ray.shutdown()
                self.connected = False
        for node in self.nodes:
            try:
                os.killpg(node.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            node.wait(30)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # processes of the cluster in sessions of their own
            strays = self._strays()
            if not strays:
                break
            for pid in strays:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(POLL_INTERVAL)
        shutil.rmtree(self.dir, ignore_errors=True)

    def _strays(self) -> list[int]:
        mine = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit() or not alive(int(entry)):
                continue
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    if self.dir.encode() in f.read():
                        mine.append(int(entry))
            except OSError:
                pass
        return mine
