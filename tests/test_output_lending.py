"""Large outputs leave the worker's output arena without a copy: they are handed on as views of it,
and the arena is lent until the last view is gone. These tests hold outputs while more requests
run (an ONNX model that writes its outputs into the arena itself, and a python model whose outputs
the worker writes there), more outputs than an instance has arenas to lend, and check that nothing
held is overwritten, that arenas let go are lent again, and that concurrent HTTP and gRPC clients
each get their own bytes."""

import gc
import threading

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from onnx import TensorProto, helper

from tritonmp import tritonserver
from tritonmp.ipc.output_arenas import MAX_ARENAS

from conftest import write_model
from make_example_repo import write

ROW = 64 * 1024  # FP32 elements per row: 256 KiB, above the size from which outputs are lent

IDENTITY_PY = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("Y", pb_utils.get_input_tensor_by_name(r, "X").as_numpy()
                                                            * 2)]) for r in requests]
"""


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    root = tmp_path_factory.mktemp("lending")
    graph = helper.make_graph([helper.make_node("Identity", ["X"], ["Y"])], "identity",
                              [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", ROW])],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["N", ROW])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    write(model, str(root / "big" / "1" / "model.onnx"))
    (root / "big" / "config.pbtxt").write_text(
        'platform: "onnxruntime_onnx"\nmax_batch_size: 4\ndynamic_batching { max_queue_delay_microseconds: 2000 }\n'
        f'input [ {{ name: "X", data_type: TYPE_FP32, dims: [ {ROW} ] }} ]\n'
        f'output [ {{ name: "Y", data_type: TYPE_FP32, dims: [ {ROW} ] }} ]\n')
    write_model(root, "big_py", IDENTITY_PY, 'backend: "python"\nmax_batch_size: 0\n'
                'input [ { name: "X", data_type: TYPE_FP32, dims: [ -1 ] } ]\n'
                'output [ { name: "Y", data_type: TYPE_FP32, dims: [ -1 ] } ]\n')
    return root


def rows(seed: int, n: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).random((n, ROW), dtype=np.float32)


@pytest.mark.parametrize("model, factor", [("big", 1), ("big_py", 2)])
def test_held_outputs_stay_intact_and_arenas_stay_bounded(repo, model, factor):
    with tritonserver.Server(model_repository=str(repo)) as server:
        m = server.model(model)

        def infer(seed):
            x = rows(seed) if model == "big" else rows(seed)[0]
            (response,) = m.infer(inputs={"X": x})
            return np.from_dlpack(response.outputs["Y"])

        held = [infer(seed) for seed in range(MAX_ARENAS + 3)]  # more than an instance lends: the rest are copies
        for _ in range(5):
            infer(100)
        for seed, y in enumerate(held):
            expected = rows(seed) if model == "big" else rows(seed)[0]
            assert np.array_equal(y, expected * factor), f"output {seed} changed under its holder"
        lent = held[0]
        del held, y
        gc.collect()
        for seed in range(20):  # once let go, arenas are lent again
            assert np.array_equal(infer(seed), (rows(seed) if model == "big" else rows(seed)[0]) * factor)
        assert lent.base is not None  # a view that outlives everything else keeps its memory
        assert np.array_equal(lent, rows(0) * factor if model == "big" else rows(0)[0] * factor)
    assert lent.sum() > 0  # even after the server stopped


def test_concurrent_clients_each_get_their_own_bytes(repo, start_server):
    server = start_server([repo])
    failures: list[str] = []

    def client(index: int) -> None:
        try:
            if index % 2:
                c = grpcclient.InferenceServerClient(server.grpc_url)
                module = grpcclient
            else:
                c = httpclient.InferenceServerClient(server.url, network_timeout=60)
                module = httpclient
            for i in range(8):
                seed = index * 100 + i
                model = "big" if i % 2 else "big_py"
                x = rows(seed) if model == "big" else rows(seed)[0]
                inp = module.InferInput("X", list(x.shape), "FP32")
                if module is httpclient:
                    inp.set_data_from_numpy(x, binary_data=True)
                    out = [httpclient.InferRequestedOutput("Y", binary_data=True)]
                else:
                    inp.set_data_from_numpy(x)
                    out = [grpcclient.InferRequestedOutput("Y")]
                y = c.infer(model, [inp], outputs=out).as_numpy("Y")
                if not np.array_equal(y, x * (1 if model == "big" else 2)):
                    failures.append(f"client {index} request {i} ({model}) got another request's bytes")
            c.close()
        except Exception as e:  # noqa: BLE001 - reported below with the client's number
            failures.append(f"client {index}: {e!r}")

    threads = [threading.Thread(target=client, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures, failures
