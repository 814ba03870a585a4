"""The in-process API (tritonmp.tritonserver, tritonmp.tritonfrontend), used as Triton's
`tritonserver` and `tritonfrontend` packages are: real worker processes run the ONNX and python
models, errors are Triton's classes, and nothing is left behind when the program ends."""

import asyncio
import ctypes
import json
import os
import queue
import re
import resource
import signal
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tritonmp import tritonfrontend, tritonserver
from tritonmp.gpus import visible_gpus
from tritonmp.tritonserver._api import _dlpack, _gpu

import procfs
from conftest import EXAMPLE_REPO, ROOT, TEST_MODELS, free_ports, shm_segments, wait_for, write_model

ONES = np.ones((1, 3), np.float32)


ECHO = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("Y", pb_utils.get_input_tensor_by_name(r, "X").as_numpy())])
                for r in requests]
"""
MARK = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    \"\"\"Y = X; then X[0] = -1 where the input is writable: a mark left in the memory it was read from.\"\"\"

    def execute(self, requests):
        responses = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "X").as_numpy()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", np.array(x))]))
            if x.flags.writeable:
                x[0] = -1
        return responses
"""
ECHO_IO = {"input": [{"name": "X", "data_type": "TYPE_STRING", "dims": [-1]}],
           "output": [{"name": "Y", "data_type": "TYPE_STRING", "dims": [-1]}]}


@pytest.fixture(scope="module")
def server(example_repo, tmp_path_factory):
    own = tmp_path_factory.mktemp("inprocess")
    write_model(own, "echo", ECHO, 'backend: "python"\nmax_batch_size: 0\n'
                'input [ { name: "X", data_type: TYPE_STRING, dims: [ -1 ] } ]\n'
                'output [ { name: "Y", data_type: TYPE_STRING, dims: [ -1 ] } ]\n')
    write_model(own, "mark", MARK, 'backend: "python"\nmax_batch_size: 0\n'
                'input [ { name: "X", data_type: TYPE_FP32, dims: [ -1 ] } ]\n'
                'output [ { name: "Y", data_type: TYPE_FP32, dims: [ -1 ] } ]\n')
    s = tritonserver.Server(model_repository=[str(example_repo), str(TEST_MODELS), str(own)],
                            model_control_mode=tritonserver.ModelControlMode.EXPLICIT,
                            startup_models=["add", "add_py", "repeat", "ticker", "crash", "echo", "accumulate", "mark"])
    s.start(wait_until_ready=True, timeout=120)
    yield s
    s.stop()
    assert not shm_segments(os.getpid())


def test_an_unstarted_or_misconfigured_server_raises_tritons_errors():
    with pytest.raises(tritonserver.InvalidArgumentError, match="Server not started"):
        tritonserver.Server().ready()
    with pytest.raises(TypeError):
        tritonserver.Server(server_id=1, model_repository=str(EXAMPLE_REPO)).start()
    with pytest.raises(TypeError):
        tritonserver.Server(model_repository=1).start()
    with pytest.raises(tritonserver.InternalError):
        tritonserver.Server(model_repository="does/not/exist").start()
    with pytest.raises(tritonserver.InvalidArgumentError):
        tritonserver.Server(model_repository=None).start()
    with pytest.raises(tritonserver.UnsupportedError, match="repo_agent_directory"):
        tritonserver.Server(model_repository=str(EXAMPLE_REPO), repo_agent_directory="/elsewhere").start()


def test_inference_on_onnx_and_python_models(server):
    assert server.ready() and server.live()
    for model in ("add", "add_py"):
        responses = list(server.model(model).infer(inputs={"A": ONES, "B": ONES * 2}))
        assert len(responses) == 1 and responses[0].final and responses[0].error is None
        np.testing.assert_array_equal(np.from_dlpack(responses[0].outputs["C"]), ONES * 3)
    # Tensors and any DLPack producer are inputs too; outputs are DLPack producers
    a = np.array([[1.0, 2.0, 3.0]], np.float32)
    request = server.model("add").create_request(inputs={"A": tritonserver.Tensor.from_dlpack(a), "B": ONES},
                                                 request_id="mine")
    (response,) = server.model("add").infer(request)
    assert response.request_id == "mine"
    assert response.outputs["C"].data_type == tritonserver.DataType.FP32
    assert np.from_dlpack(response.outputs["C"]).tolist() == [[2.0, 3.0, 4.0]]


def test_strings_round_trip(server):
    for value in (np.array(["hello", "wörld"], dtype=object), ["hello", "wörld"],
                  tritonserver.Tensor.from_string_array(["hello", "wörld"])):
        (response,) = server.model("echo").infer(inputs={"X": value})
        assert response.outputs["Y"].to_string_array().tolist() == ["hello", "wörld"]
        assert response.outputs["Y"].to_bytes_array().tolist() == [b"hello", "wörld".encode()]
    (response,) = server.model("echo").infer(inputs={"X": "one"})
    assert response.outputs["Y"].to_string_array().tolist() == ["one"]


def test_a_bytes_tensors_memory_is_tritons_serialized_buffer(server):
    """data_ptr and size of a BYTES tensor describe Triton's buffer (each element's 4-byte length, then
    its bytes), which programs such as Triton's OpenAI frontend read text from; and the classes are
    where Triton's package keeps them."""
    (response,) = server.model("echo").infer(inputs={"X": ["hi", "wörld"]})
    assert isinstance(response, tritonserver._api._response.InferenceResponse)
    tensor = response.outputs["Y"]
    raw = ctypes.string_at(tensor.data_ptr, tensor.size)
    assert raw == b"\x02\x00\x00\x00hi\x06\x00\x00\x00" + "wörld".encode()
    assert tensor.to_bytes_array().tolist() == [b"hi", "wörld".encode()]  # still an array of its elements


def test_model_metadata_config_statistics_and_properties(server):
    model = server.model("add_py")
    assert model.ready()
    assert model.metadata()["name"] == "add_py" and {i["name"] for i in model.metadata()["inputs"]} == {"A", "B"}
    assert model.config()["name"] == "add_py"
    assert model.statistics()["model_stats"][0]["name"] == "add_py"
    assert model.batch_properties() in (tritonserver.ModelBatchFlag.FIRST_DIM, tritonserver.ModelBatchFlag.UNKNOWN)
    assert model.transaction_properties() == tritonserver.ModelTxnPropertyFlag.ONE_TO_ONE
    assert server.model("repeat").transaction_properties() == tritonserver.ModelTxnPropertyFlag.DECOUPLED
    assert ("add_py", 1) in server.models() and server.models()["add_py"].name == "add_py"
    assert "nv_inference_request_success" in server.metrics()


def test_errors_raise_or_come_in_the_response(server):
    with pytest.raises(tritonserver.NotFoundError):
        list(server.model("nope").infer(inputs={"A": ONES}))
    with pytest.raises(tritonserver.InvalidArgumentError):
        list(server.model("add").infer(inputs={"A": ONES}))  # B is missing
    (response,) = server.model("add").infer(inputs={"A": ONES}, raise_on_error=False)
    assert isinstance(response.error, tritonserver.InvalidArgumentError) and response.final
    with pytest.raises(TypeError, match="an input's name must be a str, got None"):
        server.model("add").infer(inputs={"A": ONES, None: ONES})  # as Triton's bindings refuse it


def _n(n):
    return {"N": np.array([n], np.int32)}


def test_a_decoupled_model_streams_its_responses_as_they_come(server):
    responses = list(server.model("repeat").infer(inputs=_n(3)))
    assert [np.from_dlpack(r.outputs["I"]).tolist() for r in responses[:3]] == [[0], [1], [2]]
    assert [r.final for r in responses] == [False, False, False, True] and responses[3].outputs == {}
    user_queue: queue.SimpleQueue = queue.SimpleQueue()
    list(server.model("repeat").infer(inputs=_n(2), response_queue=user_queue))
    assert [user_queue.get(timeout=30).final for _ in range(3)] == [False, False, True]


def test_async_inference_and_asyncio_response_queues(server):
    async def main():
        got = [np.from_dlpack(r.outputs["I"]).tolist() async for r in server.model("repeat").async_infer(
            inputs=_n(2)) if r.outputs]
        user_queue: asyncio.Queue = asyncio.Queue()
        async for _ in server.model("add_py").async_infer(inputs={"A": ONES, "B": ONES}, response_queue=user_queue):
            pass
        queued = await asyncio.wait_for(user_queue.get(), 30)
        both = await asyncio.gather(*(_collect(server.model("add").async_infer(inputs={"A": ONES, "B": ONES * k}))
                                      for k in (1, 2)))
        return got, np.from_dlpack(queued.outputs["C"]).tolist(), both

    got, queued, both = asyncio.run(main())
    assert got == [[0], [1]] and queued == [[2.0, 2.0, 2.0]]
    assert both == [[[2.0, 2.0, 2.0]], [[3.0, 3.0, 3.0]]]


async def _collect(responses):
    return [np.from_dlpack(r.outputs["C"]).tolist() async for r in responses][0]


def test_cancelling_a_request_reaches_the_model(tmp_path):
    # a server of its own, whose log (the model's lines too) goes to a file this test reads
    explicit = tritonserver.ModelControlMode.EXPLICIT
    log_file = tmp_path / "server.log"
    with tritonserver.Server(model_repository=str(TEST_MODELS), model_control_mode=explicit, log_info=True,
                             log_file=str(log_file), startup_models=["ticker"]) as server:
        responses = server.model("ticker").infer(inputs=_n(-1), raise_on_error=False)  # one tick, then it waits
        first = next(responses)
        assert np.from_dlpack(first.outputs["I"]).tolist() == [0]
        responses.cancel()
        rest = list(responses)
        assert isinstance(rest[-2].error, tritonserver.CancelledError) and rest[-1].final
        wait_for(lambda: "ticker: cancelled after" in log_file.read_text(), 30, "the model to see is_cancelled()")
        assert list(server.model("ticker").infer(inputs=_n(0)))[-1].final  # it goes on serving


def test_a_request_cancelled_at_once_still_ends_with_a_final_response(server):
    # cancel() right after infer() mostly lands before the engine has even started the request
    model = server.model("add")
    for _ in range(30):
        responses = model.infer(inputs={"A": ONES, "B": ONES}, raise_on_error=False)
        responses.cancel()
        got = _drain_within(responses, 30)
        assert got[-1].final
        assert all(r.error is None or isinstance(r.error, tritonserver.CancelledError) for r in got)

    async def cancelled_async():
        responses = model.async_infer(inputs={"A": ONES, "B": ONES}, raise_on_error=False)
        responses.cancel()
        return [r async for r in responses]

    for _ in range(10):
        assert asyncio.run(asyncio.wait_for(cancelled_async(), 30))[-1].final
    (answer,) = model.infer(inputs={"A": ONES, "B": ONES})  # and it goes on serving
    assert np.from_dlpack(answer.outputs["C"]).tolist() == [[2.0, 2.0, 2.0]]


def _drain_within(responses, seconds: float) -> list:
    """Every response of an iterator, taken on a thread of its own: a hang fails instead of blocking."""
    got: list = []
    taker = threading.Thread(target=lambda: got.extend(responses), daemon=True)
    taker.start()
    taker.join(seconds)
    assert not taker.is_alive(), "the response iterator never ended"
    return got



def test_shared_arrays_are_read_in_place_by_the_workers(server):
    """An input in a Server.shared_array reaches the worker without a copy: the model's mark in
    its input shows in the caller's array, which an ordinary array's copy never shows."""
    shared = server.shared_array(8, np.float32)
    shared[:] = np.arange(8)
    (response,) = server.model("mark").infer(inputs={"X": shared[2:6]})  # a slice: its own place in the memory
    np.testing.assert_array_equal(np.from_dlpack(response.outputs["Y"]), [2, 3, 4, 5])
    np.testing.assert_array_equal(shared, [0, 1, -1, 3, 4, 5, 6, 7])
    ordinary = np.arange(4, dtype=np.float32)
    server.model("mark").infer(inputs={"X": ordinary})
    np.testing.assert_array_equal(ordinary, [0, 1, 2, 3])  # copied once: the mark stayed in the copy
    a, b = server.shared_array((2, 3)), server.shared_array((2, 6))
    a[:], b[:, ::2] = 1, [[1, 2, 3], [4, 5, 6]]
    (response,) = server.model("add").infer(inputs={"A": a, "B": b[:, ::2]})  # B not contiguous: copied
    np.testing.assert_array_equal(np.from_dlpack(response.outputs["C"]), [[2, 3, 4], [5, 6, 7]])
    fd = int(server._shared.ref(a).key.rsplit("/", 1)[1])
    del a, response
    import gc

    gc.collect()
    assert not os.path.exists(f"/proc/self/fd/{fd}") or os.readlink(f"/proc/self/fd/{fd}").find("shared-array") < 0
    with pytest.raises(tritonserver.InvalidArgumentError):
        server.shared_array(3, object)

def test_dlpack_capsules_made_and_taken_here_round_trip_through_numpy_and_torch():
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    borrowed = _dlpack.borrow(a.__dlpack__())
    assert (borrowed.pointer, borrowed.device, borrowed.shape, borrowed.dtype) == (a.ctypes.data, (1, 0), (3, 4),
                                                                                   np.float32)
    borrowed.release()
    borrowed.release()  # once only
    with pytest.raises(ValueError, match="not contiguous"):
        _dlpack.borrow(np.asfortranarray(a).__dlpack__())
    before = _dlpack.exported_count()
    took = np.from_dlpack(_Producer(a, device=1))
    np.testing.assert_array_equal(took, a)
    assert took.ctypes.data == a.ctypes.data and _dlpack.exported_count() == before + 1
    del took
    assert _dlpack.exported_count() == before  # the consumer's deleter released the owner
    unused = _Producer(a, device=1).__dlpack__()
    del unused  # never consumed: the capsule's destructor releases the owner
    assert _dlpack.exported_count() == before
    torch = pytest.importorskip("torch")
    np.testing.assert_array_equal(torch.from_dlpack(_Producer(a, device=1)).numpy(), a)
    assert _dlpack.exported_count() == before
    t = torch.arange(6, dtype=torch.int64).reshape(2, 3)
    from_torch = _dlpack.borrow(t.__dlpack__())
    assert (from_torch.pointer, from_torch.shape, from_torch.dtype) == (t.data_ptr(), (2, 3), np.int64)
    from_torch.release()


def test_a_numpy_view_of_a_tensor_keeps_the_tensor_alive_and_takes_its_shape():
    """As in Triton's in-process API: the DLPack capsule's owner is the Tensor (not the array under it),
    the view shares its memory, and a view taken after the shape changed has the new shape."""
    owner = np.arange(8, dtype=np.float64)
    tensor = tritonserver.Tensor.from_dlpack(owner)
    del owner
    refs = sys.getrefcount(tensor)
    view = np.from_dlpack(tensor)
    assert sys.getrefcount(tensor) == refs + 1  # the view holds the Tensor
    assert view.ctypes.data == tensor.data_ptr
    tensor.shape = [2, 4]
    reshaped = np.from_dlpack(tensor)
    assert view.shape == (8,) and reshaped.shape == (2, 4) and reshaped.ctypes.data == tensor.data_ptr
    del view, reshaped
    assert sys.getrefcount(tensor) == refs  # the consumers' deleters let it go
    frozen = np.arange(3, dtype=np.int32)
    frozen.flags.writeable = False  # read-only memory goes out as a copy: no consumer may write it
    copy = np.from_dlpack(tritonserver.Tensor.from_dlpack(frozen))
    np.testing.assert_array_equal(copy, frozen)
    assert copy.ctypes.data != frozen.ctypes.data


class _Producer:
    """A DLPack producer over a host array, claiming any device: what a GPU library's tensor looks
    like to the API, for the host-memory CUDA below."""

    def __init__(self, array, device=2, numpys=False):
        self.array, self.device, self.numpys, self.streams = array, device, numpys, []

    def __dlpack__(self, stream=None, **_):
        self.streams.append(stream)
        if self.numpys:  # numpy's own capsule, with its strides
            return self.array.__dlpack__()
        return _dlpack.export(self.array.ctypes.data, (self.device, 0), self.array.shape, self.array.dtype, self.array)

    def __dlpack_device__(self):
        return self.device, 0


class _HostMemoryCuda:
    """The CUDA runtime calls of the in-process API, done in host memory: the API's own GPU logic
    (borrowing, copies, export, release) runs on machines without a GPU; test_torch_gpu_tensors_*
    runs it on the real runtime."""

    def __init__(self):
        self.live = {}

    def set_device(self, device):
        assert device == 0

    def malloc(self, nbytes):
        buffer = ctypes.create_string_buffer(max(nbytes, 1))
        self.live[ctypes.addressof(buffer)] = buffer
        return ctypes.addressof(buffer)

    def free(self, pointer):
        del self.live[pointer]

    def copy(self, dst, src, nbytes):
        ctypes.memmove(dst, src, nbytes)

    def synchronize(self, stream):
        assert stream == 0


def test_gpu_tensors_in_and_out_on_a_host_memory_cuda(server, monkeypatch):
    cuda = _HostMemoryCuda()
    monkeypatch.setattr(_gpu, "_runtime", cuda)
    before = _dlpack.exported_count()
    a = _Producer(np.array([[1.0, 2.0, 3.0]], np.float32))
    tensor = tritonserver.Tensor.from_dlpack(a)
    assert (tensor.memory_type, tensor.memory_type_id, tensor.data_ptr) == (tritonserver.MemoryType.GPU, 0,
                                                                           a.array.ctypes.data)
    assert a.streams == [1] and _dlpack.exported_count() == before + 1  # borrowed, not copied
    for memory in ("gpu", "cuda:0", tritonserver.MemoryType.GPU, (tritonserver.DLDeviceType.kDLCUDA, 0)):
        (response,) = server.model("add").infer(inputs={"A": a, "B": tensor}, output_memory_type=memory)
        c = response.outputs["C"]
        assert c.memory_type == tritonserver.MemoryType.GPU and c.__dlpack_device__() == (2, 0)
        assert c.data_ptr in cuda.live
        np.testing.assert_array_equal(np.from_dlpack(c.to_host()), [[2.0, 4.0, 6.0]])
        taken = _dlpack.borrow(c.__dlpack__())  # a GPU library's view of the output
        assert taken.pointer == c.data_ptr and taken.device == (2, 0)
        del response, c
        assert len(cuda.live) == 1  # the consumer's reference keeps the memory
        taken.release()
        assert not cuda.live
    del tensor
    assert _dlpack.exported_count() == before  # every borrowed input handed back
    moved = tritonserver.Tensor.from_dlpack(ONES).to_device("gpu:0")
    assert moved.memory_type == tritonserver.MemoryType.GPU and moved.to_device("cuda") is moved
    np.testing.assert_array_equal(np.from_dlpack(moved.to_device("cpu")), ONES)
    del moved
    assert not cuda.live
    (text,) = server.model("echo").infer(inputs={"X": ["a"]}, output_memory_type="gpu")
    assert text.outputs["Y"].memory_type == tritonserver.MemoryType.CPU  # BYTES stay in host memory
    with pytest.raises(tritonserver.InvalidArgumentError, match="not contiguous"):
        tritonserver.Tensor.from_dlpack(_Producer(np.zeros((3, 2), np.float32).T, numpys=True))
    with pytest.raises(tritonserver.InvalidArgumentError, match="memory type or device"):
        tritonserver.Tensor.from_dlpack(ONES).to_device("tpu:0")

    def out_of_memory(nbytes):
        raise ValueError(f"cudaMalloc of {nbytes} bytes failed: out of memory (CUDA error 2)")

    cuda.malloc = out_of_memory  # an output that cannot be copied to the GPU fails its response
    (failed,) = server.model("add").infer(inputs={"A": ONES, "B": ONES}, output_memory_type="gpu",
                                          raise_on_error=False)
    assert failed.final and isinstance(failed.error, tritonserver.InternalError) and not failed.outputs
    assert "out of memory" in str(failed.error)
    with pytest.raises(tritonserver.InternalError, match="out of memory"):
        list(server.model("add").infer(inputs={"A": ONES, "B": ONES}, output_memory_type="gpu"))
    np.testing.assert_array_equal(  # and the model serves on
        np.from_dlpack(next(iter(server.model("add").infer(inputs={"A": ONES, "B": ONES}))).outputs["C"]), ONES * 2)


def test_a_model_versions_batching_timer_goes_with_it(server):
    """add_py's 100 us batching delay is waited on a timerfd of its scheduler, closed on unload."""
    def timerfds():
        fds = []
        for fd in os.listdir("/proc/self/fd"):
            try:
                if os.readlink(f"/proc/self/fd/{fd}") == "anon_inode:[timerfd]":
                    fds.append(fd)
            except OSError:  # the listing's own descriptor, gone already
                pass
        return len(fds)

    (response,) = server.model("add_py").infer(inputs={"A": ONES, "B": ONES})
    assert response.error is None
    armed = timerfds()
    assert armed >= 1
    server.unload("add_py", wait_until_unloaded=True, timeout=30)
    assert timerfds() == armed - 1
    server.load("add_py")
    assert server.model("add_py").ready()


@pytest.mark.gpu
@pytest.mark.skipif(not visible_gpus(), reason="no NVIDIA GPU visible on this machine")
def test_torch_gpu_tensors_in_and_out(server):
    torch = pytest.importorskip("torch", reason="needs torch (install tritonmp[torch])")
    if not torch.cuda.is_available():
        pytest.skip("torch was built without CUDA")
    before = _dlpack.exported_count()
    a = torch.arange(3, dtype=torch.float32, device="cuda").reshape(1, 3)
    (response,) = server.model("add").infer(inputs={"A": a, "B": ONES}, output_memory_type="gpu")
    c = torch.from_dlpack(response.outputs["C"])
    assert c.is_cuda and c.tolist() == [[1.0, 2.0, 3.0]]
    assert np.from_dlpack(response.outputs["C"].to_host()).tolist() == [[1.0, 2.0, 3.0]]
    moved = tritonserver.Tensor.from_dlpack(ONES).to_device((tritonserver.MemoryType.GPU, 0))
    assert torch.from_dlpack(moved).cpu().tolist() == ONES.tolist()
    del c, response, moved
    assert _dlpack.exported_count() == before


def test_sequences_priorities_and_timeouts_reach_the_scheduler(server):
    sums = []
    for i, x in enumerate((1, 2, 3)):
        flags = (1 if i == 0 else 0) | (2 if i == 2 else 0)  # TRITONSERVER_REQUEST_FLAG_SEQUENCE_START / _END
        (response,) = server.model("accumulate").infer(inputs={"X": np.array([[x]], np.int32)}, correlation_id=42,
                                                       flags=flags, priority=1, timeout=10_000_000)
        sums.append(int(np.from_dlpack(response.outputs["SUM"]).flat[0]))
        assert int(np.from_dlpack(response.outputs["SEEN_ID"]).flat[0]) == 42
    assert sums == [1, 3, 6]
    with pytest.raises(tritonserver.InvalidArgumentError, match="correlation ID"):
        list(server.model("accumulate").infer(inputs={"X": np.array([[1]], np.int32)}))


def test_a_crashing_model_raises_and_its_instance_comes_back(server):
    with pytest.raises(tritonserver.InternalError, match="crash"):
        list(server.model("crash").infer(inputs={"X": np.array([-1.0], np.float32)}))
    (response,) = server.model("crash").infer(inputs={"X": np.array([7.0], np.float32)})
    assert np.from_dlpack(response.outputs["Y"]).tolist() == [7.0]


def test_load_with_a_config_override_and_unload(server):
    config = json.dumps({"backend": "python", "max_batch_size": 0, **ECHO_IO,
                         "parameters": {"marker": {"string_value": "overridden"}}})
    model = server.load("echo", {"config": config})
    assert model.config()["parameters"]["marker"]["string_value"] == "overridden"
    # names that cannot be a model: Triton's InvalidArgumentError and words; the others are not found
    for name, words in (("..", "must not contain path traversal characters"), ("a/b", "path traversal"),
                        ("", "Model name cannot be empty"), ("  ", "Model name cannot be empty")):
        with pytest.raises(tritonserver.InvalidArgumentError, match=words):
            server.load(name)
    with pytest.raises(tritonserver.InternalError, match="not a valid model name"):
        server.load(".hidden")
    server.unload("echo", wait_until_unloaded=True, timeout=30)
    assert not server.model("echo").ready()
    server.load("echo")
    assert "marker" not in server.model("echo").config().get("parameters", {})


def test_a_verbose_log_file_gets_the_servers_records_and_nothing_else_keeps_them(example_repo, tmp_path):
    """As Triton's in-process server: its log goes to Options.log_file alone. A handler on the program's
    root logger, and on each logger that does not propagate (where pytest puts its capture), sees none
    of its records; the memory tracemalloc traces over a thousand verbose inferences grows by less than
    Triton's own test_api.py allows (120 KB), and the server's handler is gone once it stops."""
    import gc
    import logging
    import tracemalloc

    from tritonmp import logs

    seen: list[logging.LogRecord] = []

    class Capture(logging.Handler):
        def emit(self, record):
            seen.append(record)

    capture = Capture()
    handlers_before = list(logs.ROOT.handlers)  # the module's own server's
    loggers = [logging.getLogger()] + [lg for lg in logging.root.manager.loggerDict.values()
                                       if isinstance(lg, logging.Logger) and not lg.propagate]
    for lg in loggers:
        lg.addHandler(capture)
    log_file = tmp_path / "server.log"

    def run(s, n):
        for i in range(n):
            inputs = {"A": np.random.rand(1, 3).astype(np.float32), "B": ONES}
            for response in s.model("add").infer(inputs=inputs, request_id=f"to-the-file-{i}", raise_on_error=True):
                np.testing.assert_array_equal(np.from_dlpack(response.outputs["C"]), inputs["A"] + ONES)

    try:
        with tritonserver.Server(model_repository=str(example_repo), log_verbose=1, log_file=str(log_file),
                                 model_control_mode=tritonserver.ModelControlMode.EXPLICIT,
                                 startup_models=["add"]) as s:
            run(s, 100)
            gc.collect()
            tracemalloc.start()
            try:
                before, _ = tracemalloc.get_traced_memory()
                run(s, 1000)
                grown = tracemalloc.get_traced_memory()[0] - before
            finally:
                tracemalloc.stop()
    finally:
        for lg in loggers:
            lg.removeHandler(capture)
    assert "to-the-file-999" in log_file.read_text()
    assert not [r for r in seen if r.name.startswith("tritonmp")]
    assert grown < 120_000, f"{grown} bytes more traced after 1000 inferences"
    assert logs.ROOT.handlers == handlers_before


def test_memory_does_not_grow_over_thousands_of_requests(server):
    def run(n):
        for _ in range(n):
            for response in server.model("add").infer(inputs={"A": ONES, "B": ONES}):
                np.from_dlpack(response.outputs["C"])

    run(500)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    run(3000)
    grown_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    assert grown_kib < 16 * 1024, f"the process grew by {grown_kib} KiB over 3000 requests"


def test_kserve_http_grpc_and_metrics_over_an_in_process_server(server):
    http_port, grpc_port, metrics_port = free_ports(3)
    with tritonfrontend.KServeHttp(server, tritonfrontend.KServeHttp.Options(port=http_port)), \
            tritonfrontend.KServeGrpc(server, tritonfrontend.KServeGrpc.Options(port=grpc_port)), \
            tritonfrontend.Metrics(server, tritonfrontend.Metrics.Options(port=metrics_port)):
        client = httpclient.InferenceServerClient(f"127.0.0.1:{http_port}")
        try:
            inputs = [httpclient.InferInput("A", [1, 3], "FP32"), httpclient.InferInput("B", [1, 3], "FP32")]
            for x in inputs:
                x.set_data_from_numpy(ONES)
            assert client.infer("add", inputs).as_numpy("C").tolist() == [[2.0, 2.0, 2.0]]
        finally:
            client.close()
        with grpcclient.InferenceServerClient(f"127.0.0.1:{grpc_port}") as grpc:
            inputs = [grpcclient.InferInput("A", [1, 3], "FP32"), grpcclient.InferInput("B", [1, 3], "FP32")]
            for x in inputs:
                x.set_data_from_numpy(ONES)
            assert grpc.infer("add_py", inputs).as_numpy("C").tolist() == [[2.0, 2.0, 2.0]]
            assert grpc.is_model_ready("repeat")
        from conftest import http_request

        status, _, body = http_request(metrics_port, "GET", "/metrics")
        assert status == 200 and b'nv_inference_request_success{model="add",version="1"}' in body
    with pytest.raises(tritonserver.InvalidArgumentError, match="Options"):
        tritonfrontend.KServeHttp(server, tritonfrontend.KServeGrpc.Options())


def test_tritonfrontend_takes_the_commands_own_settings(server):
    """The options of this server's own (limits, the gRPC engine) reach the listeners the `tritonmp`
    command serves too."""
    from conftest import http_request

    http_port, grpc_port = free_ports(2)
    http_options = tritonfrontend.KServeHttp.Options(port=http_port, max_input_size=65536)
    grpc_options = tritonfrontend.KServeGrpc.Options(port=grpc_port, engine="grpcio")
    with tritonfrontend.KServeHttp(server, http_options), tritonfrontend.KServeGrpc(server, grpc_options):
        big = b'{"inputs": [' + b" " * 70000 + b"]}"
        status, _, body = http_request(http_port, "POST", "/v2/models/add_py/infer", big)
        assert status == 413 and b"Request body of 70014 bytes" in body
        with grpcclient.InferenceServerClient(f"127.0.0.1:{grpc_port}") as grpc:
            inputs = [grpcclient.InferInput("A", [1, 3], "FP32"), grpcclient.InferInput("B", [1, 3], "FP32")]
            for x in inputs:
                x.set_data_from_numpy(ONES)
            assert grpc.infer("add", inputs).as_numpy("C").tolist() == [[2.0, 2.0, 2.0]]
    with pytest.raises(tritonserver.InvalidArgumentError, match="engine"):
        tritonfrontend.KServeGrpc(server, tritonfrontend.KServeGrpc.Options(engine="netty"))


def test_tritonfrontend_restricted_features(server):
    """RestrictedFeatures as Triton's tritonfrontend takes them: the named groups answer only with the
    header and value; a feature that names no group is refused when the service is made."""
    from conftest import http_request

    (http_port,) = free_ports(1)
    features = tritonfrontend.RestrictedFeatures()
    features.create_feature_group("admin-key", "secret", ["model-repository", "statistics"])
    options = tritonfrontend.KServeHttp.Options(port=http_port, restricted_features=features)
    with tritonfrontend.KServeHttp(server, options):
        status, _, body = http_request(http_port, "POST", "/v2/repository/index", b"{}")
        assert status == 403 and b"admin-key" in body
        status, _, _ = http_request(http_port, "POST", "/v2/repository/index", b"{}", {"admin-key": "secret"})
        assert status == 200
        assert http_request(http_port, "GET", "/v2/health/ready")[0] == 200  # not restricted
    wrong = tritonfrontend.RestrictedFeatures()
    wrong.create_feature_group("k", "v", ["no-such-group"])
    with pytest.raises(tritonserver.InvalidArgumentError, match="no-such-group"):
        tritonfrontend.KServeHttp(server, tritonfrontend.KServeHttp.Options(restricted_features=wrong))


PROGRAM = """
import signal, sys
import numpy as np
from tritonmp import tritonserver
server = tritonserver.Server(model_repository=sys.argv[1]).start(wait_until_ready=True)
list(server.model("add_py").infer(inputs={"A": np.ones((1, 3), np.float32), "B": np.ones((1, 3), np.float32)}))
print("READY", flush=True)
if sys.argv[2] == "exit":
    sys.stdin.readline()  # the test has seen the workers
    sys.exit(0)  # without stop()
signal.pause()  # until the test's SIGTERM
"""


@pytest.mark.parametrize("how", ["exit", "SIGTERM"])
def test_nothing_is_left_behind_however_the_program_ends(tmp_path, how):
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "add_py").symlink_to(EXAMPLE_REPO / "add_py")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent(PROGRAM), str(repo), how], stdout=subprocess.PIPE,
                            stdin=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env, start_new_session=True)
    try:
        assert proc.stdout.readline().strip() == b"READY"
        workers = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True).stdout.split()
        assert workers, "the program should have a worker process"
        if how == "SIGTERM":
            proc.send_signal(signal.SIGTERM)
        else:
            proc.stdin.close()
        proc.wait(60)
        wait_for(lambda: not any(os.path.exists(f"/proc/{pid}") for pid in workers), 30, "the workers to exit")
        assert not shm_segments(proc.pid)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def test_a_server_dropped_without_stop_stops_its_workers(example_repo):
    import gc

    explicit = tritonserver.ModelControlMode.EXPLICIT
    server = tritonserver.Server(model_repository=str(example_repo), model_control_mode=explicit,
                                 startup_models=["add_py"]).start(wait_until_ready=True)
    workers = [i.pid for mv in server._engine.models.models["add_py"].versions.values() for i in mv.instances()]
    assert workers and None not in workers
    del server
    gc.collect()
    wait_for(lambda: not any(procfs.alive(pid) for pid in workers), 30, "the dropped server's workers to exit")


def test_options_without_a_counterpart_are_refused_not_ignored(server):
    repo = str(EXAMPLE_REPO)
    refusals = [dict(cache_config={"redis": {"host": "x"}}),
                dict(backend_configuration={"onnxruntime": {"enable-global-threadpool": "1"}}),
                dict(pinned_memory_pool_size=0)]
    for options in refusals:
        with pytest.raises(tritonserver.UnsupportedError):
            tritonserver.Server(model_repository=repo, **options).start()
    if not visible_gpus():
        with pytest.raises(tritonserver.UnsupportedError, match="GPU memory needs the CUDA runtime and a GPU"):
            list(server.model("add").infer(inputs={"A": ONES, "B": ONES}, output_memory_type="gpu"))
    with pytest.raises(tritonserver.InvalidArgumentError, match="output memory type"):
        list(server.model("add").infer(inputs={"A": ONES, "B": ONES}, output_memory_type="disk"))
    with pytest.raises(tritonserver.InvalidArgumentError, match="asyncio.Queue"):
        server.model("add").infer(inputs={"A": ONES, "B": ONES}, response_queue=asyncio.Queue())


def test_the_rate_limiter_options_reach_the_server(tmp_path):
    from test_rate_limiter import TIMED_CONFIG, TIMED_PY

    write_model(tmp_path, "greedy", TIMED_PY, TIMED_CONFIG.replace("{extra}", "").replace("count: 2 }", "count: 4 }"))
    options = dict(rate_limiter_mode=tritonserver.RateLimitMode.EXEC_COUNT,
                   rate_limiter_resources=[tritonserver.RateLimiterResource("R", 1, 0)])
    with pytest.raises(tritonserver.InternalError, match='Resource count for "R" is limited to 1 which will prevent'):
        tritonserver.Server(model_repository=str(tmp_path), **options).start()


def test_options_that_contradict_each_other_are_refused_in_the_options_own_words():
    repo = str(EXAMPLE_REPO)
    cases = [(dict(load_on_demand=True, model_control_mode=tritonserver.ModelControlMode.POLL),
              "Options.load_on_demand works with Options.model_control_mode none or explicit"),
             (dict(max_resident_models=2),
              "Options.max_resident_models and Options.max_resident_memory_mb need Options.load_on_demand")]
    explicit = tritonserver.ModelControlMode.EXPLICIT
    cases.append((dict(model_control_mode=explicit, startup_models=["*", "add"]),
                  "Wildcard model name '*' must be the ONLY startup model if specified at all."))
    for options, words in cases:
        with pytest.raises(tritonserver.InvalidArgumentError, match=re.escape(words)):
            tritonserver.Server(model_repository=repo, **options).start()
    # a startup model no repository holds: Triton's words
    with pytest.raises(tritonserver.InternalError,
                       match="failed to poll model 'nowhere': model not found in any model repository"):
        tritonserver.Server(model_repository=repo, model_control_mode=explicit, startup_models=["nowhere"]).start()


def test_frontend_options_they_cannot_honour_are_refused(server):
    unsupported = [(tritonfrontend.KServeGrpc, tritonfrontend.KServeGrpc.Options(reuse_port=True)),
                   (tritonfrontend.KServeGrpc, tritonfrontend.KServeGrpc.Options(infer_compression_level=2))]
    for service, options in unsupported:
        with pytest.raises(tritonserver.UnsupportedError):
            service(server, options)
    invalid = [(tritonfrontend.KServeHttp, tritonfrontend.KServeHttp.Options(port=70000)),
               (tritonfrontend.KServeHttp, tritonfrontend.KServeHttp.Options(thread_count=0)),
               (tritonfrontend.KServeHttp, tritonfrontend.KServeHttp.Options(header_forward_pattern="(x")),
               (tritonfrontend.KServeGrpc, tritonfrontend.KServeGrpc.Options(forward_header_pattern="(x")),
               (tritonfrontend.KServeGrpc, tritonfrontend.KServeGrpc.Options(use_ssl=True)),
               (tritonfrontend.Metrics, tritonfrontend.Metrics.Options(thread_count=0))]
    for service, options in invalid:
        with pytest.raises(tritonserver.InvalidArgumentError):
            service(server, options)
    with pytest.raises(tritonserver.UnavailableError, match="not started"):
        unstarted = tritonserver.Server()
        tritonfrontend.KServeHttp(unstarted, tritonfrontend.KServeHttp.Options(port=free_ports(1)[0])).start()


def test_a_repository_registered_while_serving_serves_its_folders_under_the_names_given(server, tmp_path):
    """Server.register_model_repository, as Triton's: a folder served under the name the mapping gives
    (its config's name yields to it), loaded and answered; unregistered, it is gone from the index."""
    extra = tmp_path / "extra"
    write_model(extra, "folder", ECHO, 'name: "folder"\nbackend: "python"\nmax_batch_size: 0\n'
                'input [ { name: "X", data_type: TYPE_STRING, dims: [ -1 ] } ]\n'
                'output [ { name: "Y", data_type: TYPE_STRING, dims: [ -1 ] } ]\n')
    server.register_model_repository(str(extra), {"folder": "renamed"})
    with pytest.raises(tritonserver.AlreadyExistsError, match="has already been registered"):
        server.register_model_repository(str(extra), {})
    server.load("renamed")
    (response,) = list(server.model("renamed").infer(inputs={"X": np.array(["hi"], dtype=np.object_)}))
    assert response.outputs["Y"].to_string_array().tolist() == ["hi"]
    server.unload("renamed", wait_until_unloaded=True)
    server.unregister_model_repository(str(extra))
    assert not [key for key in server.models() if key[0] == "renamed"]


def test_a_program_written_for_triton_runs_unchanged_with_the_packages_under_tritons_names(example_repo):
    """`python -m tritonmp.as_triton` is the folder that makes `import tritonserver` and `import
    tritonfrontend` tritonmp's: a program written for Triton's packages, naming their private module
    paths as Triton's OpenAI frontend does, runs as it is."""
    program = f'''
import numpy as np
import tritonserver
from tritonfrontend import KServeHttp

def first(response: tritonserver._api._response.InferenceResponse) -> list:
    return np.from_dlpack(response.outputs["C"]).tolist()

server = tritonserver.Server(model_repository="{example_repo}", startup_models=["add"],
                             model_control_mode=tritonserver.ModelControlMode.EXPLICIT).start(wait_until_ready=True)
try:
    ones = np.ones((1, 3), np.float32)
    (response,) = server.model("add").infer(inputs={{"A": ones, "B": ones}})
    assert isinstance(response, tritonserver._api._response.InferenceResponse) and KServeHttp.Options().port == 8000
    print(first(response))
finally:
    server.stop()
'''
    folder = subprocess.run([sys.executable, "-m", "tritonmp.as_triton"], capture_output=True, text=True,
                            check=True).stdout.strip()
    result = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=120,
                            env={**os.environ, "PYTHONPATH": folder})
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip().splitlines()[-1] == "[[2.0, 2.0, 2.0]]"
