"""Client system shared memory over HTTP and gRPC: registration and its errors, inputs read from
and outputs written into client regions by the worker, mixed with ordinary tensors."""

import numpy as np
import orjson
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException

from conftest import serving


@pytest.fixture(scope="module")
def shm_server(example_repo, test_repo, tmp_path_factory):
    with serving([example_repo, test_repo], ["--allow-client-shm=true"], tmp_path_factory) as s:
        yield s


@pytest.fixture
def regions(request):
    """Client regions made with tritonclient's helpers, destroyed after the test."""
    made = []

    def make(name, size):
        handle = shm.create_shared_memory_region(name, f"/{name}-{request.node.name[:20]}-t", size)
        made.append(handle)
        return handle, f"/{name}-{request.node.name[:20]}-t"

    yield make
    for handle in made:
        shm.destroy_shared_memory_region(handle)


@pytest.mark.parametrize("module", [httpclient, grpcclient], ids=["http", "grpc"])
def test_inputs_and_outputs_through_client_regions(shm_server, regions, module):
    url = shm_server.url if module is httpclient else shm_server.grpc_url
    client = module.InferenceServerClient(url)
    client.unregister_system_shared_memory()
    a = np.arange(24, dtype=np.float32).reshape(8, 3)
    b = np.full((8, 3), 0.5, np.float32)
    in_handle, in_key = regions("in", 2 * a.nbytes)
    out_handle, out_key = regions("out", a.nbytes + 16)
    shm.set_shared_memory_region(in_handle, [a])
    shm.set_shared_memory_region(in_handle, [b], offset=a.nbytes)
    client.register_system_shared_memory("in", in_key, 2 * a.nbytes)
    client.register_system_shared_memory("out", out_key, a.nbytes + 16)
    for model in ("add", "add_py"):
        inputs = [module.InferInput("A", [8, 3], "FP32"), module.InferInput("B", [8, 3], "FP32")]
        inputs[0].set_shared_memory("in", a.nbytes)
        inputs[1].set_shared_memory("in", b.nbytes, offset=a.nbytes)
        outputs = [module.InferRequestedOutput("C")]
        outputs[0].set_shared_memory("out", a.nbytes, offset=16)
        response = client.infer(model, inputs, outputs=outputs).get_response()
        # the bytes are in the region, not in the response
        if module is httpclient:
            assert response["outputs"] == [{"name": "C", "datatype": "FP32", "shape": [8, 3]}]
        else:
            assert list(response.raw_output_contents) == [b""]
        got = shm.get_contents_as_numpy(out_handle, np.float32, [8, 3], offset=16)
        np.testing.assert_array_equal(got, a + b)
        shm.set_shared_memory_region(out_handle, [np.zeros((8, 3), np.float32)], offset=16)
    client.unregister_system_shared_memory()


def test_shm_inputs_mix_with_ordinary_tensors(shm_server, regions):
    client = httpclient.InferenceServerClient(shm_server.url)
    a = np.ones((1, 3), np.float32)
    handle, key = regions("mix", a.nbytes)
    shm.set_shared_memory_region(handle, [a * 7])
    client.register_system_shared_memory("mix", key, a.nbytes)
    try:
        inputs = [httpclient.InferInput("A", [1, 3], "FP32"), httpclient.InferInput("B", [1, 3], "FP32")]
        inputs[0].set_shared_memory("mix", a.nbytes)
        inputs[1].set_data_from_numpy(a)
        np.testing.assert_array_equal(client.infer("add", inputs).as_numpy("C"), a * 8)
        g = grpcclient.InferenceServerClient(shm_server.grpc_url)
        inputs = [grpcclient.InferInput("A", [1, 3], "FP32"), grpcclient.InferInput("B", [1, 3], "FP32")]
        inputs[0].set_data_from_numpy(a)
        inputs[1].set_shared_memory("mix", a.nbytes)
        np.testing.assert_array_equal(g.infer("add_py", inputs).as_numpy("C"), a * 8)
    finally:
        client.unregister_system_shared_memory("mix")


def test_status_register_and_unregister(shm_server, regions):
    client = httpclient.InferenceServerClient(shm_server.url)
    _, key = regions("st", 64)
    client.register_system_shared_memory("st", key, 32, offset=16)
    assert client.get_system_shared_memory_status("st") == [{"name": "st", "key": key, "offset": 16, "byte_size": 32}]
    g = grpcclient.InferenceServerClient(shm_server.grpc_url)
    status = g.get_system_shared_memory_status(as_json=True)["regions"]["st"]
    assert status == {"name": "st", "key": key, "offset": "16", "byte_size": "32"}
    with pytest.raises(InferenceServerException, match="shared memory region 'st' already in manager"):
        client.register_system_shared_memory("st", key, 32)
    with pytest.raises(InferenceServerException) as e:
        g.register_system_shared_memory("st", key, 32)
    assert e.value.status() == "StatusCode.ALREADY_EXISTS"
    g.unregister_system_shared_memory("st")
    assert client.get_system_shared_memory_status() == []
    client.unregister_system_shared_memory("never-registered")  # not an error, as in Triton


@pytest.mark.parametrize("body,status,message", [
    ({"key": "/tritonmp-test-no-such-key", "offset": 0, "byte_size": 8}, 500,
     "Unable to open shared memory region: '/tritonmp-test-no-such-key'"),
    ({"key": "KEY", "offset": 0, "byte_size": 65}, 400, "failed to register shared memory region 'err': invalid args"),
    ({"key": "KEY", "offset": 60, "byte_size": 8}, 400, "failed to register shared memory region 'err': invalid args"),
    # the four bounds of Triton's qa test_register_out_of_bound: each refused in its words
    ({"key": "KEY", "offset": 1, "byte_size": 64}, 400, "failed to register shared memory region 'err': invalid args"),
    ({"key": "KEY", "offset": 64, "byte_size": 1}, 400, "failed to register shared memory region 'err': invalid args"),
    ({"key": "KEY", "offset": 65, "byte_size": 0}, 400, "failed to register shared memory region 'err': invalid args"),
    ({"key": "KEY", "offset": 0, "byte_size": 0}, 400, "failed to register shared memory region 'err': invalid args "
     "(an offset >= 0 and a byte_size > 0 are needed)"),
    ({"offset": 0, "byte_size": 8}, 400, "Shared memory register request has no 'key' field"),
])
def test_registration_errors(shm_server, regions, body, status, message):
    _, key = regions("err", 64)
    body = {k: (key if v == "KEY" else v) for k, v in body.items()}
    message = message.replace("KEY", key)
    got, _, raw = shm_server.post("/v2/systemsharedmemory/region/err/register", orjson.dumps(body))
    assert got == status, raw
    assert message in orjson.loads(raw)["error"]
    assert shm_server.get("/v2/systemsharedmemory/region/err/status")[0] == 404


def test_a_region_past_its_segment_is_invalid_on_both_protocols(shm_server, regions):
    _, key = regions("past", 64)
    g = grpcclient.InferenceServerClient(shm_server.grpc_url)
    with pytest.raises(InferenceServerException) as e:
        g.register_system_shared_memory("past", key, 64, offset=32)
    assert e.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert e.value.message() == "failed to register shared memory region 'past': invalid args"
    # the same with the key registered already, as Triton's qa expects it
    g.register_system_shared_memory("whole", key, 64)
    try:
        got, _, raw = shm_server.post("/v2/systemsharedmemory/region/past/register",
                                      orjson.dumps({"key": key, "offset": 32, "byte_size": 64}))
        assert (got, orjson.loads(raw)["error"]) == (400, "failed to register shared memory region 'past': "
                                                          "invalid args")
    finally:
        g.unregister_system_shared_memory("whole")


def _request(region_in, offset, size, out_region="o", out_size=12, out_offset=0):
    return orjson.dumps({
        "inputs": [{"name": "A", "shape": [1, 3], "datatype": "FP32",
                    "parameters": {"shared_memory_region": region_in, "shared_memory_byte_size": size,
                                   "shared_memory_offset": offset}},
                   {"name": "B", "shape": [1, 3], "datatype": "FP32", "data": [1, 1, 1]}],
        "outputs": [{"name": "C", "parameters": {"shared_memory_region": out_region,
                                                 "shared_memory_byte_size": out_size,
                                                 "shared_memory_offset": out_offset}}]})


@pytest.mark.parametrize("model", ["add", "add_py"])
@pytest.mark.parametrize("case,body,status,message", [
    ("unknown region", ("nope", 0, 12), 404, "Unable to find shared memory region: 'nope'"),
    ("offset past the end", ("i", 60, 12), 400, "Invalid offset + byte size for shared memory region: 'i'"),
    ("negative offset", ("i", -4, 12), 400,  # Triton's words (it answers 500 for JSON it cannot read)
     "Unable to parse 'shared_memory_offset': attempt to access JSON non-unsigned-integer as unsigned-integer"),
    ("size not the tensor's", ("i", 0, 8), 400, "input byte size mismatch for input 'A' for model"),
    ("output window past the end", ("i", 0, 12, "o", 12, 60), 400,
     "Invalid offset + byte size for shared memory region: 'o'"),
    ("output region too small", ("i", 0, 12, "o", 4), 500,
     "shared memory size specified with the request for output 'C' (4 bytes) should be at least 12 bytes"),
])
def test_out_of_bounds_and_unknown_regions(shm_server, regions, model, case, body, status, message):
    client = httpclient.InferenceServerClient(shm_server.url)
    in_handle, in_key = regions("i", 64)
    out_handle, out_key = regions("o", 64)
    shm.set_shared_memory_region(out_handle, [np.full(16, 9, np.float32)])
    client.register_system_shared_memory("i", in_key, 64)
    client.register_system_shared_memory("o", out_key, 64)
    try:
        got, _, raw = shm_server.post(f"/v2/models/{model}/infer", _request(*body))
        assert got == status, raw
        assert message in orjson.loads(raw)["error"]
        # nothing was written outside what the request was allowed to touch
        np.testing.assert_array_equal(shm.get_contents_as_numpy(out_handle, np.float32, [16]), np.full(16, 9))
    finally:
        client.unregister_system_shared_memory()


def test_unregistering_a_region_in_use_is_safe(shm_server, regions):
    """Requests in flight keep the worker's own mapping; later ones see the region is gone."""
    client = httpclient.InferenceServerClient(shm_server.url)
    a = np.ones((1, 4), np.float32)
    handle, key = regions("busy", a.nbytes)
    shm.set_shared_memory_region(handle, [a])
    client.register_system_shared_memory("busy", key, a.nbytes)
    inp = httpclient.InferInput("X", [1, 4], "FP32")
    inp.set_shared_memory("busy", a.nbytes)
    # batch_report holds requests in its queue for up to 300 ms, so these are in flight at the unregister
    pending = [httpclient.InferenceServerClient(shm_server.url, concurrency=4).async_infer("batch_report", [inp])
               for _ in range(4)]
    client.unregister_system_shared_memory("busy")
    for p in pending:
        try:
            np.testing.assert_array_equal(p.get_result().as_numpy("Y"), a)
        except InferenceServerException as e:  # it reached the server after the unregister
            assert "Unable to find shared memory region: 'busy'" in e.message()
    with pytest.raises(InferenceServerException, match="Unable to find shared memory region: 'busy'"):
        client.infer("batch_report", [inp])


def test_client_shm_is_refused_without_the_flag(server, regions):
    _, key = regions("off", 64)
    status, _, raw = server.post("/v2/systemsharedmemory/region/off/register",
                                 orjson.dumps({"key": key, "offset": 0, "byte_size": 64}))
    assert status == 503
    assert "--allow-client-shm=true" in orjson.loads(raw)["error"]
    with pytest.raises(InferenceServerException, match="--allow-client-shm=true"):
        grpcclient.InferenceServerClient(server.grpc_url).register_system_shared_memory("off", key, 64)


def test_messages_clients_match_on(shm_server, regions):
    _, key = regions("msgs", 64)
    status, _, raw = shm_server.post("/v2/systemsharedmemory/region/k/register",
                                     orjson.dumps({"key": "/tritonmp-no-such-key", "offset": 99, "byte_size": 0}))
    assert (status, orjson.loads(raw)["error"]) == (500, "Unable to open shared memory region: "
                                                         "'/tritonmp-no-such-key'")  # before the window is checked
    assert shm_server.post("/v2/systemsharedmemory/region/msgs/register",
                           orjson.dumps({"key": key, "offset": 0, "byte_size": 64}))[0] == 200
    try:
        a = {"name": "A", "shape": [1, 3], "datatype": "FP32", "data": [1, 2, 3]}
        for offset, message in ((100, "Invalid offset for shared memory region: 'msgs'"),
                                (60, "Invalid offset + byte size for shared memory region: 'msgs'")):
            window = {"shared_memory_region": "msgs", "shared_memory_byte_size": 12, "shared_memory_offset": offset}
            in_shm = {"name": "A", "shape": [1, 3], "datatype": "FP32", "parameters": window}
            for body in ({"inputs": [in_shm, dict(a, name="B")]},
                         {"inputs": [a, dict(a, name="B")], "outputs": [{"name": "C", "parameters": window}]}):
                status, _, raw = shm_server.post("/v2/models/add_py/infer", orjson.dumps(body))
                assert (status, orjson.loads(raw)["error"]) == (400, message), body
    finally:
        shm_server.post("/v2/systemsharedmemory/unregister", b"")


def test_registrations_missing_a_field_or_of_the_wrong_type_are_refused_in_tritons_words(shm_server):
    for doc, message in (({"offset": 0, "byte_size": 8}, "Shared memory register request has no 'key' field"),
                         ({"key": "/k", "offset": 0}, "Shared memory register request has no 'byte_size' field"),
                         ({"key": 5, "byte_size": 8}, "attempt to access JSON non-string as string"),
                         ({"key": "/k", "offset": -1, "byte_size": 8},
                          "attempt to access JSON non-unsigned-integer as unsigned-integer"),
                         ({"key": "/k", "byte_size": 8.0},
                          "attempt to access JSON non-unsigned-integer as unsigned-integer")):
        status, _, raw = shm_server.post("/v2/systemsharedmemory/region/r/register", orjson.dumps(doc))
        assert (status, orjson.loads(raw)) == (400, {"error": message}), doc
    assert orjson.loads(shm_server.get("/v2/systemsharedmemory/status")[2]) == []
