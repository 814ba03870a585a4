"""The container image, built from ./Dockerfile and run with podman: it runs as an unprivileged
user, serves a mounted Triton model repository over HTTP and gRPC, passes its own HEALTHCHECK, and
stops cleanly on SIGTERM. Run by scripts/container-check.sh, which makes the base image where none
can be pulled; skipped elsewhere."""

import json
import os
import shutil
import subprocess

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from conftest import ROOT, free_ports, wait_for

PODMAN = shutil.which("podman")
BASE = os.environ.get("TRITONMP_CONTAINER_BASE", "python:3.11-slim")


def _podman(*args, timeout=120, check=True) -> subprocess.CompletedProcess:
    done = subprocess.run([PODMAN, *args], capture_output=True, text=True, timeout=timeout)
    if check:
        assert done.returncode == 0, f"podman {' '.join(args)}: {done.stderr[-3000:]}"
    return done


def _base_present() -> bool:
    return PODMAN is not None and _podman("image", "exists", BASE, check=False).returncode == 0


pytestmark = [pytest.mark.container,
              pytest.mark.skipif(not _base_present(), reason=f"needs podman and the base image {BASE}: run "
                                                             "scripts/container-check.sh")]


@pytest.fixture(scope="module")
def image():
    tag = f"localhost/tritonmp:test-{os.getpid()}"
    extra = []
    host_ca = os.environ.get("PIP_CERT")
    if host_ca:  # this machine's pip trusts a CA of its own (an intercepting proxy): so must the build's
        certifi = _podman("run", "--rm", "--network", "none", BASE, "python", "-c",
                          "import pip._vendor.certifi as c; print(c.where())").stdout.strip()
        extra = ["--volume", f"{host_ca}:{certifi}:ro"]
    _podman("build", "--format", "docker", "--network", "host", "--build-arg", f"BASE={BASE}", *extra,
            "-t", tag, "-f", "Dockerfile", str(ROOT), timeout=1800)  # docker format: OCI images drop HEALTHCHECK
    yield tag
    _podman("rmi", "-f", tag, check=False)


def test_the_image_serves_a_mounted_repository_and_stops_on_sigterm(image, example_repo):
    inspected = json.loads(_podman("image", "inspect", image).stdout)[0]
    config = inspected["Config"]
    assert config["User"] == "10001"
    assert {"8000/tcp", "8001/tcp", "8002/tcp"} <= set(config["ExposedPorts"])
    health = inspected["Healthcheck"]["Test"]  # podman keeps it beside Config
    assert health[0] == "CMD"
    http_port, grpc_port, metrics_port = free_ports(3)
    name = f"tritonmp-test-{os.getpid()}"
    command = json.loads(_podman("image", "inspect", "--format", "{{json .Config.Cmd}}", image).stdout)
    assert command[:3] == ["tritonmp", "--model-repository", "/models"]
    _podman("run", "-d", "--name", name, "--network", "host", "--shm-size", "512m",
            "-v", f"{example_repo}:/models:ro", image, *command, "--http-port", str(http_port),
            "--grpc-port", str(grpc_port), "--metrics-port", str(metrics_port))
    try:
        client = httpclient.InferenceServerClient(f"127.0.0.1:{http_port}")

        def ready():
            try:
                return client.is_server_ready()
            except Exception:
                return _podman("inspect", "--format", "{{.State.Running}}", name).stdout.strip() != "true"

        wait_for(ready, 120, "the container to be ready")
        assert client.is_server_ready(), _podman("logs", name, check=False).stderr[-3000:]
        # the image's own HEALTHCHECK command, inside the container, aimed at the port it serves on here
        probe = [part.replace("127.0.0.1:8000", f"127.0.0.1:{http_port}") for part in health[1:]]
        assert _podman("exec", name, *probe, check=False).returncode == 0
        assert _podman("exec", name, "id", "-u").stdout.strip() == "10001"
        a = np.ones((1, 3), np.float32)
        for module, port in ((httpclient, http_port), (grpcclient, grpc_port)):
            c = module.InferenceServerClient(f"127.0.0.1:{port}")
            inputs = [module.InferInput("A", [1, 3], "FP32"), module.InferInput("B", [1, 3], "FP32")]
            inputs[0].set_data_from_numpy(a)
            inputs[1].set_data_from_numpy(a * 2)
            np.testing.assert_array_equal(c.infer("add_py", inputs).as_numpy("C"), a * 3)
        _podman("stop", "-t", "30", name)  # SIGTERM, then SIGKILL after 30 s
        assert _podman("inspect", "--format", "{{.State.ExitCode}}", name).stdout.strip() == "0"
    finally:
        _podman("rm", "-f", name, check=False)
