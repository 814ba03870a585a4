"""Workers forked from a template per backend (--worker-start fork, the default): each backend's
workers are children of its template; a template that dies takes its workers with it, and they come
back from a new one while the other backends' workers serve on; --worker-start exec starts each
worker as a fresh interpreter, the frontend's own child."""

import os
import re
import signal

import orjson
import pytest

import procfs
from conftest import wait_for

ADD = orjson.dumps({"inputs": [{"name": "A", "shape": [1, 3], "datatype": "FP32", "data": [1, 2, 3]},
                               {"name": "B", "shape": [1, 3], "datatype": "FP32", "data": [4, 5, 6]}]})


def _templates(server) -> dict[str, list[int]]:
    """Backend -> the pids of its templates, in the order they started."""
    found: dict[str, list[int]] = {}
    for backend, pid in re.findall(r"worker template for the (\w+) backend is ready \(pid (\d+)\)", server.log()):
        found.setdefault(backend, []).append(int(pid))
    return found


def _workers(server, instance: str) -> list[int]:
    return [int(p) for p in re.findall(rf"worker {instance} of model '[^']+' version \d+ is ready \(pid (\d+)\)",
                                       server.log())]


def _infer(server, model: str) -> list[float]:
    status, _, raw = server.post(f"/v2/models/{model}/infer", ADD)
    assert status == 200, raw
    return orjson.loads(raw)["outputs"][0]["data"]


def test_workers_fork_from_their_backends_template_and_come_back_when_it_dies(start_server, example_repo):
    server = start_server([example_repo])
    templates = _templates(server)
    python_template, onnx_template = templates["python"][-1], templates["onnxruntime"][-1]
    python_worker, onnx_worker = _workers(server, "add_py_0_0")[-1], _workers(server, "add_0")[-1]
    assert procfs.parent(python_worker) == python_template and procfs.parent(onnx_worker) == onnx_template
    assert procfs.parent(python_template) == server.pid and procfs.parent(onnx_template) == server.pid
    assert _infer(server, "add_py") == [5, 7, 9] and _infer(server, "add") == [5, 7, 9]

    os.kill(python_template, signal.SIGKILL)
    # its worker dies with it, and is forked again from a template started anew
    wait_for(lambda: len(_workers(server, "add_py_0_0")) == 2, 60, "the python worker to come back")
    new_template, new_worker = _templates(server)["python"][-1], _workers(server, "add_py_0_0")[-1]
    assert new_template != python_template and procfs.parent(new_worker) == new_template
    assert f"the python worker template (pid {python_template}) exited" in server.log()
    assert _infer(server, "add_py") == [5, 7, 9]
    # the other backend's template and worker were not touched
    assert _workers(server, "add_0") == [onnx_worker] and _templates(server)["onnxruntime"] == [onnx_template]
    assert _infer(server, "add") == [5, 7, 9]


def test_exec_starts_each_worker_as_the_servers_own_child(start_server, example_repo):
    server = start_server([example_repo], "--worker-start", "exec")
    assert not _templates(server)
    assert procfs.parent(_workers(server, "add_py_0_0")[-1]) == server.pid
    assert _infer(server, "add_py") == [5, 7, 9] and _infer(server, "add") == [5, 7, 9]


@pytest.mark.parametrize("start", ["fork", "exec"])
def test_a_config_larger_than_an_environment_variable_holds(start_server, example_repo, tmp_path, start):
    """A worker's spec, config included, is the first message on its socket: a 300 KiB config (an
    environment variable holds 128 KiB) starts its workers either way."""
    import shutil

    model = tmp_path / "repo" / "big_config"
    shutil.copytree(example_repo / "add_py", model)
    config = model / "config.pbtxt"
    config.write_text(config.read_text().replace('name: "add_py"', 'name: "big_config"')
                      .replace("count: 1", "count: 2")
                      + 'parameters { key: "blob" value: { string_value: "%s" } }\n' % ("x" * (300 << 10)))
    server = start_server([tmp_path / "repo"], "--worker-start", start)
    assert len({_workers(server, f"big_config_0_{i}")[-1] for i in range(2)}) == 2
    assert _infer(server, "big_config") == [5, 7, 9]


def test_where_a_template_cannot_start_its_workers_are_started_by_exec(start_server, example_repo, monkeypatch):
    monkeypatch.setenv("TRITONMP_TEMPLATE_FAILS", "python")  # the testing hook: that template exits at once
    server = start_server([example_repo])
    assert "worker add_py_0_0 of model 'add_py' is started by exec instead" in server.log()
    assert procfs.parent(_workers(server, "add_py_0_0")[-1]) == server.pid
    assert procfs.parent(_workers(server, "add_0")[-1]) == _templates(server)["onnxruntime"][-1]
    assert _infer(server, "add_py") == [5, 7, 9] and _infer(server, "add") == [5, 7, 9]
