"""Python models in their own environments (EXECUTION_ENV_PATH): two models needing different major
versions of numpy serve side by side from one repository, one from a packed environment (a .tar.gz
with `$$TRITON_MODEL_DIRECTORY`) and one from an environment directory used in place; an archive is
unpacked once for its content (two models with the same archive, their concurrent loads, a worker's
restart and a reload after the archive is touched all share one copy); a python-based backend's own
`pb_exec_env_model.py.tar.gz` is its models' environment; and an environment that cannot be used (a
damaged archive, one whose members would land outside it, one without numpy, a path that does not
exist) fails the load with the reason while the server serves on.

The environments are virtual environments built by the test with uv (numpy 1.26 in one, the
server's numpy 2 in the other), kept in a cache between runs; the archives are packed as venv-pack
packs them (the environment's files, its interpreter link included)."""

from __future__ import annotations

import io
import os
import shutil
import signal
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from conftest import NUMPY_1, python_environment, wait_for

NUMPY_2 = np.__version__  # the server's own, so the environment and the server differ in nothing else
REPORTER = '''
import locale, os, sys
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    @staticmethod
    def auto_complete_config(config):
        config.set_max_batch_size(0)
        config.add_input({"name": "INPUT", "data_type": "TYPE_FP32", "dims": [1]})
        config.add_output({"name": "NUMPY", "data_type": "TYPE_STRING", "dims": [1]})
        config.add_output({"name": "PREFIX", "data_type": "TYPE_STRING", "dims": [1]})
        return config

    def initialize(self, args):
        print(f"Python version is {sys.version_info.major}.{sys.version_info.minor}, NumPy version is "
              f"{np.version.version}", flush=True)

    def execute(self, requests):
        return [pb_utils.InferenceResponse([
            pb_utils.Tensor("NUMPY", np.array([np.__version__.encode()], dtype=np.object_)),
            pb_utils.Tensor("PREFIX", np.array([sys.prefix.encode()], dtype=np.object_))]) for _ in requests]
'''
EXTRACTING = "Extracting Python execution env"


def _pack(env: Path, archive: Path) -> None:
    """The environment as venv-pack packs it: its files under the archive's root, links kept."""
    with tarfile.open(archive, "w:gz", compresslevel=1) as tar:
        for entry in sorted(env.iterdir()):
            if entry.name != ".complete":
                tar.add(entry, arcname=entry.name)


@pytest.fixture(scope="module")
def environments(tmp_path_factory) -> dict[str, Path]:
    envs = {"numpy1": python_environment(NUMPY_1), "numpy2": python_environment(NUMPY_2),
            "bare": python_environment("")}
    archive = tmp_path_factory.mktemp("archives") / "numpy1.tar.gz"
    _pack(envs["numpy1"], archive)
    envs["archive"] = archive
    return envs


def _model(repo: Path, name: str, env_path: str, config: str = 'backend: "python"\n', code: str = REPORTER) -> Path:
    model = repo / name
    (model / "1").mkdir(parents=True)
    if code:
        (model / "1" / "model.py").write_text(code)
    parameter = f'parameters: {{ key: "EXECUTION_ENV_PATH", value: {{ string_value: "{env_path}" }} }}\n'
    (model / "config.pbtxt").write_text(config + (parameter if env_path else ""))
    return model


def _report(client, model: str) -> tuple[str, str]:
    x = httpclient.InferInput("INPUT", [1], "FP32")
    x.set_data_from_numpy(np.array([1], np.float32))
    result = client.infer(model, [x])
    return result.as_numpy("NUMPY")[0].decode(), result.as_numpy("PREFIX")[0].decode()


def _damaged(path: Path, archive: Path) -> None:
    data = archive.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _escaping(path: Path) -> None:
    with tarfile.open(path, "w:gz") as tar:
        info = tarfile.TarInfo("../outside.txt")
        info.size = 3
        tar.addfile(info, io.BytesIO(b"bad"))


def test_models_in_their_own_environments(start_server, tmp_path, environments):
    repo, backends, cache = tmp_path / "models", tmp_path / "backends", tmp_path / "env-cache"
    archive = environments["archive"]
    for name in ("numpy1", "numpy1_again"):  # the same archive in two models: one copy unpacked
        model = _model(repo, name, "$$TRITON_MODEL_DIRECTORY/env.tar.gz")
        shutil.copy(archive, model / "env.tar.gz")
    _model(repo, "numpy2", str(environments["numpy2"]))  # a directory, used in place
    (backends / "reporter").mkdir(parents=True)
    (backends / "reporter" / "model.py").write_text(REPORTER)
    shutil.copy(archive, backends / "reporter" / "pb_exec_env_model.py.tar.gz")
    _model(repo, "based", "", 'backend: "reporter"\n', code="")
    _model(repo, "own", "")  # the server's own interpreter, beside them
    # what cannot be used
    _damaged(_model(repo, "damaged", "$$TRITON_MODEL_DIRECTORY/env.tar.gz") / "env.tar.gz", archive)
    _escaping(_model(repo, "escaping", "$$TRITON_MODEL_DIRECTORY/env.tar.gz") / "env.tar.gz")
    _model(repo, "no_numpy", str(environments["bare"]))
    _model(repo, "missing", "$$TRITON_MODEL_DIRECTORY/nowhere.tar.gz")
    _model(repo, "in_a_bucket", "s3://bucket/env.tar.gz")

    server = start_server([repo], f"--backend-directory={backends}", f"--python-env-cache={cache}",
                          "--model-control-mode=explicit", *(f"--load-model={m}" for m in
                                                              ("numpy1", "numpy1_again", "numpy2", "based", "own")))
    client = httpclient.InferenceServerClient(server.url)
    unpacked = next(p for p in (cache / "archives").iterdir() if p.is_dir())
    for model in ("numpy1", "numpy1_again", "based"):
        assert _report(client, model) == (NUMPY_1, str(unpacked))
    assert _report(client, "numpy2") == (NUMPY_2, str(environments["numpy2"]))
    assert _report(client, "own") == (NUMPY_2, sys.prefix)
    assert f"Python version is 3.{sys.version_info.minor}, NumPy version is {NUMPY_1}" in server.log()
    assert server.log().count(EXTRACTING) == 1, server.log()

    # a worker that dies is exec'd again in its environment; a reload after the archive is touched
    # unpacks nothing (its content is the same)
    before = _workers_in(server.pid, unpacked)
    assert len(before) == 3  # numpy1's, numpy1_again's and based's
    os.kill(min(before), signal.SIGKILL)
    wait_for(lambda: len(after := _workers_in(server.pid, unpacked)) == 3 and after != before, 30, "the restart")
    wait_for(lambda: all(_ready(client, m) for m in ("numpy1", "numpy1_again", "based")), 30, "readiness")
    assert _report(client, "numpy1_again")[0] == NUMPY_1 and _report(client, "numpy1")[0] == NUMPY_1
    os.utime(repo / "numpy1" / "env.tar.gz")
    client.load_model("numpy1")
    assert _report(client, "numpy1")[0] == NUMPY_1
    assert server.log().count(EXTRACTING) == 1

    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    failures = {}
    for name in ("damaged", "escaping", "no_numpy", "missing", "in_a_bucket"):
        with pytest.raises(InferenceServerException) as e:
            grpc.load_model(name)
        failures[name] = e.value.message()
    assert "env.tar.gz' cannot be unpacked" in failures["damaged"], failures
    assert "cannot be unpacked" in failures["escaping"] and "outside" in failures["escaping"], failures
    assert not (repo / "escaping" / "outside.txt").exists() and not (cache / "archives" / "outside.txt").exists()
    assert f"the environment '{environments['bare']}' has no numpy, which the worker needs" in failures["no_numpy"]
    assert "nowhere.tar.gz' does not exist" in failures["missing"]
    assert "'s3://bucket/env.tar.gz' is in object storage" in failures["in_a_bucket"]
    assert not list((cache / "archives").glob("*.partial-*")), "a failed unpacking leaves nothing behind"
    assert _report(client, "numpy2")[0] == NUMPY_2  # the server serves on


def _workers_in(server_pid: int, root: Path) -> set[int]:
    """The server's worker processes running the interpreter of the environment at `root`."""
    out = subprocess.run(["pgrep", "-P", str(server_pid)], capture_output=True, text=True).stdout.split()
    found = set()
    for pid in map(int, out):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if cmdline[0].decode().startswith(str(root)) and b"tritonmp.workers.main" in cmdline:
            found.add(pid)
    return found


def _ready(client, model: str) -> bool:
    try:
        return client.is_model_ready(model)
    except InferenceServerException:
        return False


def test_environments_built_from_requirements(start_server, tmp_path):
    """--python-env-from-requirements: a python model with a requirements.txt beside its model.py and no
    EXECUTION_ENV_PATH runs in an environment built from it, once for two models with the same
    requirements; requirements that cannot be installed fail the load with the build's log; without
    the flag the file is only a file."""
    repo, cache = tmp_path / "models", tmp_path / "env-cache"
    for name in ("pinned", "pinned_again"):
        (_model(repo, name, "") / "1" / "requirements.txt").write_text(f"numpy=={NUMPY_1}\n")
    (_model(repo, "impossible", "") / "1" / "requirements.txt").write_text("tritonmp-no-such-package==0.0.1\n")
    server = start_server([repo], f"--python-env-cache={cache}", "--python-env-from-requirements=true",
                          "--model-control-mode=explicit", "--load-model=pinned", "--load-model=pinned_again")
    client = httpclient.InferenceServerClient(server.url)
    built = next(p for p in (cache / "requirements").iterdir() if p.is_dir())
    assert _report(client, "pinned") == (NUMPY_1, str(built))
    assert _report(client, "pinned_again") == (NUMPY_1, str(built))
    assert server.log().count("Building Python execution env") == 1
    with pytest.raises(InferenceServerException) as e:
        client.load_model("impossible")
    assert "building an environment from" in e.value.message() and "tritonmp-no-such-package" in e.value.message()
    assert not list((cache / "requirements").glob("*.partial-*"))

    plain = start_server([repo], f"--python-env-cache={tmp_path / 'other-cache'}", "--model-control-mode=explicit",
                         "--load-model=pinned")
    assert _report(httpclient.InferenceServerClient(plain.url), "pinned") == (NUMPY_2, sys.prefix)


def test_a_passed_probe_is_remembered_until_the_environment_changes(start_server, tmp_path):
    """A second server with the same cache runs no probe of an unchanged environment; once a package
    is taken out of it, the next server probes it again and refuses it with the reason."""
    env, repo, cache = tmp_path / "env", tmp_path / "models", tmp_path / "env-cache"
    shutil.copytree(python_environment(NUMPY_1), env, symlinks=True)
    _model(repo, "m", str(env))
    args = (f"--python-env-cache={cache}", "--model-control-mode=explicit", "--load-model=m")
    first = start_server([repo], *args)
    assert _report(httpclient.InferenceServerClient(first.url), "m")[0] == NUMPY_1
    assert len(list((cache / "probed").iterdir())) == 1
    first.stop()
    (record,) = (cache / "probed").iterdir()
    written = record.stat().st_mtime_ns
    second = start_server([repo], *args)  # the remembered probe: its record is read, not written again
    assert _report(httpclient.InferenceServerClient(second.url), "m")[0] == NUMPY_1
    assert list((cache / "probed").iterdir()) == [record] and record.stat().st_mtime_ns == written
    second.stop()
    site = next(env.glob("lib/python3*/site-packages"))
    for entry in site.iterdir():
        if entry.name.startswith("numpy"):
            shutil.rmtree(entry)
    third = start_server([repo], f"--python-env-cache={cache}", "--model-control-mode=explicit")
    with pytest.raises(InferenceServerException, match="has no numpy, which the worker needs"):
        grpcclient.InferenceServerClient(third.grpc_url).load_model("m")
