"""The worker's heap policy (--worker-heap-retain-mb): memory a model frees stays mapped for its next
request while the worker is busy, and goes back to the kernel once it has been idle; 0 leaves the C
library's own policy, which unmaps a large block the moment it is freed. And the worker's start-up
heap is out of the garbage collector's sight once the model is loaded."""

import re

import numpy as np
import pytest
import tritonclient.http as httpclient

import procfs
from conftest import X_TO_Y_CONFIG, write_model

ALLOCATING_MODEL = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "X").as_numpy()
            big = np.full(16 << 20, x[0], np.float32)  # 64 MiB, every page touched, freed before the answer
            total = np.array([big[::4096].sum()], np.float32)
            del big
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", total)]))
        return out
"""
MIB = 1 << 20


def _worker_rss(server) -> int:
    (pid,) = re.findall(r"worker alloc_0 of model 'alloc' version 1 is ready \(pid (\d+)\)", server.log())
    return procfs.rss_bytes(int(pid))


def _infer(server) -> None:
    x = httpclient.InferInput("X", [1], "FP32")
    x.set_data_from_numpy(np.array([1.0], np.float32))
    result = httpclient.InferenceServerClient(server.url).infer("alloc", [x])
    assert result.as_numpy("Y").tolist() == [4096.0]


@pytest.fixture
def repo(tmp_path):
    write_model(tmp_path / "repo", "alloc", ALLOCATING_MODEL, X_TO_Y_CONFIG)
    return tmp_path / "repo"


def test_freed_memory_is_kept_while_busy_and_returned_when_idle(start_server, repo, monkeypatch):
    monkeypatch.setenv("TRITONMP_WORKER_IDLE_TRIM_S", "1")
    server = start_server([repo])  # the default: up to 1024 MiB kept
    before = _worker_rss(server)
    _infer(server)
    assert _worker_rss(server) - before >= 56 * MIB  # the model's 64 MiB stay mapped for the next request
    _infer(server)
    assert _worker_rss(server) - before < 100 * MIB  # and the next request reused them
    server.wait_until(lambda: _worker_rss(server) - before < 24 * MIB, 30, "the idle worker to return its memory")


def test_zero_leaves_the_c_library_policy(start_server, repo):
    server = start_server([repo], "--worker-heap-retain-mb", "0")
    before = _worker_rss(server)
    _infer(server)
    assert _worker_rss(server) - before < 24 * MIB  # unmapped when freed


GC_MODEL = """
import gc

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.made_at_start = [{"n": i} for i in range(5000)]  # lives as long as the model

    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("Y", np.array([gc.get_freeze_count()], np.float32))])
                for _ in requests]
"""


def test_the_start_up_heap_is_frozen_out_of_the_collector(start_server, tmp_path):
    """What loading made (modules, the model's own objects) is frozen once the model is loaded, so
    a full collection does not walk it (107 ms with torch and onnxruntime imported)."""
    write_model(tmp_path / "repo", "frozen", GC_MODEL, X_TO_Y_CONFIG)
    server = start_server([tmp_path / "repo"])
    x = httpclient.InferInput("X", [1], "FP32")
    x.set_data_from_numpy(np.array([1.0], np.float32))
    frozen = httpclient.InferenceServerClient(server.url).infer("frozen", [x]).as_numpy("Y")[0]
    assert frozen > 5000  # the model's 5,000 dicts, and the modules beside them
