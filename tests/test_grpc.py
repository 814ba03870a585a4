"""The gRPC frontend through tritonclient.grpc (sync, streaming and asyncio clients)."""

import asyncio
import queue

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as grpcaio
from tritonclient.utils import InferenceServerException

from conftest import SERVED_EXTENSIONS, add_inputs


def test_health_and_metadata(server):
    client = grpcclient.InferenceServerClient(server.grpc_url)
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready("add") and not client.is_model_ready("add", "9")
    meta = client.get_server_metadata()
    assert meta.name == "triton"
    assert set(meta.extensions) == SERVED_EXTENSIONS
    model = client.get_model_metadata("add_py", as_json=True)
    assert model == {"name": "add_py", "versions": ["1"], "platform": "python",
                     "inputs": [{"name": "A", "datatype": "FP32", "shape": ["-1", "3"]},
                                {"name": "B", "datatype": "FP32", "shape": ["-1", "3"]}],
                     "outputs": [{"name": "C", "datatype": "FP32", "shape": ["-1", "3"]}]}
    config = client.get_model_config("add").config
    assert config.max_batch_size == 8 and config.platform == "onnxruntime_onnx"


def test_infer_with_raw_contents(server):
    client = grpcclient.InferenceServerClient(server.grpc_url)
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    result = client.infer("add", add_inputs(grpcclient, a, a), request_id="g-1",
                          outputs=[grpcclient.InferRequestedOutput("C")])
    np.testing.assert_array_equal(result.as_numpy("C"), a + a)
    assert result.get_response().id == "g-1"


def test_infer_with_typed_contents(server):
    from tritonclient.grpc import service_pb2 as pb

    client = grpcclient.InferenceServerClient(server.grpc_url)
    request = pb.ModelInferRequest(model_name="add")
    for name, values in (("A", [1.0, 2.0, 3.0]), ("B", [4.0, 5.0, 6.0])):
        t = request.inputs.add(name=name, datatype="FP32", shape=[1, 3])
        t.contents.fp32_contents.extend(values)
    response = client._client_stub.ModelInfer(request)
    assert np.frombuffer(response.raw_output_contents[0], np.float32).tolist() == [5.0, 7.0, 9.0]


def test_every_datatype_round_trips(server):
    from test_datatypes import TYPES

    client = grpcclient.InferenceServerClient(server.grpc_url)
    inputs = []
    for dt, value in TYPES.items():
        t = grpcclient.InferInput(f"IN_{dt}", list(value.shape), dt)
        t.set_data_from_numpy(value)
        inputs.append(t)
    result = client.infer("identity", inputs)
    for dt, value in TYPES.items():
        np.testing.assert_array_equal(result.as_numpy(f"OUT_{dt}"), value, err_msg=dt)


@pytest.mark.parametrize("model,version,code,message", [
    ("nope", "", "StatusCode.NOT_FOUND", "Request for unknown model: 'nope' is not found"),
    ("add", "5", "StatusCode.NOT_FOUND", "Request for unknown model: 'add' version 5 is not found"),
])
def test_unknown_model_and_version(server, model, version, code, message):
    client = grpcclient.InferenceServerClient(server.grpc_url)
    a = np.ones((1, 3), np.float32)
    with pytest.raises(InferenceServerException) as e:
        client.infer(model, add_inputs(grpcclient, a, a), model_version=version)
    assert e.value.status() == code and message in e.value.message()


@pytest.mark.parametrize("version,served", [("1", True), ("01", True), (" 1", True), ("+1", True), ("1abc", True),
                                           ("1.5", True), ("0x1", False), ("-0", False)])
def test_version_strings_are_read_as_triton_reads_them(server, version, served):
    """Triton reads a gRPC model version with std::stol: leading space, a sign and digits, the rest
    ignored ("1abc" is version 1, "0x1" version 0)."""
    client = grpcclient.InferenceServerClient(server.grpc_url)
    a = np.ones((1, 3), np.float32)
    assert client.is_model_ready("add", version) is served
    if served:
        np.testing.assert_array_equal(client.infer("add", add_inputs(grpcclient, a, a), model_version=version)
                                      .as_numpy("C"), a + a)
        return
    with pytest.raises(InferenceServerException) as e:
        client.infer("add", add_inputs(grpcclient, a, a), model_version=version)
    assert e.value.status() == "StatusCode.NOT_FOUND"
    assert e.value.message() == "Request for unknown model: 'add' version 0 is not found"


@pytest.mark.parametrize("version,message", [
    ("abc", "failed to get model version from specified version string 'abc' (details: stol), version should be "
            "an integral value > 0"),
    ("9223372036854775808", "failed to get model version from specified version string '9223372036854775808' "
                            "(details: stol), version should be an integral value > 0"),
    ("-1", "invalid model version specified '-1' , version should be an integral value > 0"),
])
def test_a_version_string_that_is_no_version_is_invalid_everywhere(server, version, message):
    client = grpcclient.InferenceServerClient(server.grpc_url)
    a = np.ones((1, 3), np.float32)
    calls = {"ready": lambda: client.is_model_ready("nope", version),  # before the model is looked up
             "metadata": lambda: client.get_model_metadata("add", version),
             "config": lambda: client.get_model_config("add", version),
             "statistics": lambda: client.get_inference_statistics("add", version),
             "infer": lambda: client.infer("nope", add_inputs(grpcclient, a, a), model_version=version)}
    for what, call in calls.items():
        with pytest.raises(InferenceServerException) as e:
            call()
        assert (e.value.status(), e.value.message()) == ("StatusCode.INVALID_ARGUMENT", message), what


def test_bad_input_is_invalid_argument(server):
    client = grpcclient.InferenceServerClient(server.grpc_url)
    a = np.ones((1, 4), np.float32)
    with pytest.raises(InferenceServerException) as e:
        client.infer("add", add_inputs(grpcclient, a, a))
    assert e.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert "unexpected shape for input 'A' for model 'add'. Expected [-1,3], got [1,4]" in e.value.message()


def test_stream_answers_in_request_order_except_for_decoupled_models(server, tmp_path):
    """As Triton's stream handler: the responses to requests for models that are not decoupled go
    back in the order their requests came on the stream, even when a later one finishes first; a
    decoupled model's responses are not held behind them."""
    client = grpcclient.InferenceServerClient(server.grpc_url)
    results: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    gate = tmp_path / "gate"
    try:
        held = grpcclient.InferInput("X", [1, 1], "INT32")
        held.set_data_from_numpy(np.array([[1]], np.int32))
        client.async_stream_infer("sequence_slots", [held], request_id="held", sequence_id=31,
                                  sequence_start=True, sequence_end=True, parameters={"hold": str(gate)})
        server.wait_until((tmp_path / "gate.held").exists, 30, "the first request to run")
        before = client.get_inference_statistics("add").model_stats[0].inference_count
        for i in range(3):
            a = np.full((1, 3), i, np.float32)
            client.async_stream_infer("add", add_inputs(grpcclient, a, a), request_id=f"add{i}")
        n = grpcclient.InferInput("N", [1], "INT32")
        n.set_data_from_numpy(np.array([2], np.int32))
        client.async_stream_infer("repeat", [n], request_id="repeat")
        early = [results.get(timeout=30) for _ in range(2)]  # the decoupled model's, while the first is held
        assert [(r.get_response().id, e) for r, e in early] == [("repeat", None), ("repeat", None)]
        server.wait_until(lambda: client.get_inference_statistics("add").model_stats[0].inference_count
                          == before + 3, 30, "the add requests to finish")
        assert results.empty()  # finished, but held behind the first
        gate.touch()
        rest = [results.get(timeout=30) for _ in range(4)]
    finally:
        client.stop_stream()
    assert [(r.get_response().id, e) for r, e in rest] == [("held", None), ("add0", None), ("add1", None),
                                                          ("add2", None)]


def test_stream_many_requests_in_flight_and_errors_in_stream(server):
    client = grpcclient.InferenceServerClient(server.grpc_url)
    results: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    try:
        sent = {}
        for i in range(64):
            a = np.full((1, 3), i, np.float32)
            sent[str(i)] = a + a
            client.async_stream_infer("add", add_inputs(grpcclient, a, a), request_id=str(i))
        bad = np.ones((1, 4), np.float32)
        client.async_stream_infer("add", add_inputs(grpcclient, bad, bad), request_id="bad")
        got, errors = {}, []
        for _ in range(65):
            result, error = results.get(timeout=30)
            if error is not None:
                errors.append(error)
            else:
                got[result.get_response().id] = result.as_numpy("C")
    finally:
        client.stop_stream()
    assert set(got) == set(sent)
    for key, want in sent.items():
        np.testing.assert_array_equal(got[key], want)
    assert len(errors) == 1 and "unexpected shape for input 'A'" in str(errors[0])


def test_asyncio_client(server):
    async def main():
        async with grpcaio.InferenceServerClient(server.grpc_url) as client:
            assert await client.is_server_ready()
            a = np.ones((2, 3), np.float32)
            results = await asyncio.gather(*(client.infer("add_py", add_inputs(grpcaio, a * i, a))
                                             for i in range(16)))
            for i, r in enumerate(results):
                np.testing.assert_array_equal(r.as_numpy("C"), a * i + a)

    asyncio.run(main())


def test_http_asyncio_client(server):
    import tritonclient.http.aio as httpaio

    async def main():
        client = httpaio.InferenceServerClient(server.url)
        try:
            assert await client.is_server_ready()
            a = np.ones((2, 3), np.float32)
            results = await asyncio.gather(*(client.infer("add", add_inputs(httpaio, a * i, a)) for i in range(16)))
            for i, r in enumerate(results):
                np.testing.assert_array_equal(r.as_numpy("C"), a * i + a)
        finally:
            await client.close()

    asyncio.run(main())


def test_typed_contents_beside_raw_contents_are_refused_in_tritons_words(server):
    from probes import mixed_contents_errors

    message = "contents field must not be specified when using raw_input_contents for 'A' for model 'add_py'"
    assert mixed_contents_errors(server.grpc_url) == [("INVALID_ARGUMENT", message)] * 3


def test_request_parameters_of_tritons_own_are_refused_or_taken_as_triton_does(server):
    """A `triton_` request parameter is Triton's: an unknown one is refused, and the one it knows
    must be a bool (what the model sees of it: test_python_api)."""
    from probes import reserved_parameter_answers

    assert reserved_parameter_answers(server.grpc_url) == [
        ("INVALID_ARGUMENT", "parameter keys starting with 'triton_' are reserved for Triton usage. Only the following "
                             "keys starting with 'triton_' are allowed: triton_enable_empty_final_response"),
        ("INVALID_ARGUMENT", "invalid value type for 'triton_enable_empty_final_response' parameter, expected "
                             "bool_param."),
        ("OK", "")]


GRPC_PARAMETER_ANSWERS = {  # Triton 2.51's answers (test_compat compares them with its own)
    "priority as a string": ("INVALID_ARGUMENT", "invalid value type for 'priority' parameter, expected int64_param "
                                                 "or uint64_param."),
    "negative priority": ("INVALID_ARGUMENT", "invalid value for 'priority', expected value >= 0."),
    "priority as uint64": ("OK", ""),
    "timeout as a string": ("INVALID_ARGUMENT", "invalid value type for 'timeout' parameter, expected int64_param."),
    "sequence_id as a bool": ("INVALID_ARGUMENT", "invalid value type for 'sequence_id' parameter, expected "
                                                  "int64_param or string_param."),
    "sequence_start as an int": ("INVALID_ARGUMENT", "invalid value type for 'sequence_start' parameter, expected "
                                                     "bool_param."),
    "sequence_end as a string": ("INVALID_ARGUMENT", "invalid value type for 'sequence_end' parameter, expected "
                                                     "bool_param."),
    "a model's parameter as uint64": ("INVALID_ARGUMENT", "invalid value type for 'custom' parameter, expected "
                                                          "int64_param, bool_param, or string_param."),
    "a model's parameter as a double": ("OK", ""),
    "more raw contents than inputs": ("OK", ""),
    "raw contents for one input of two": ("INVALID_ARGUMENT", "unable to find data for input tensor 'B' for model "
                                                              "'add_py' in request."),
    "no data at all": ("INVALID_ARGUMENT", "unable to find data for input tensor 'A' for model 'add_py' in request."),
    "region without a size": ("INVALID_ARGUMENT", "'shared_memory_byte_size' must be specified along with "
                                                  "'shared_memory_region' parameter for tensor 'A'"),
    "size without a region": ("INVALID_ARGUMENT", "'shared_memory_byte_size' can not be specified without "
                                                  "'shared_memory_region' parameter for tensor 'A'"),
    "offset without a region": ("INVALID_ARGUMENT", "'shared_memory_offset' can not be specified without "
                                                    "'shared_memory_region' parameter for tensor 'A'"),
    "region as an int": ("INVALID_ARGUMENT", "invalid value type for 'shared_memory_region' parameter for tensor "
                                             "'A', expected string_param."),
    "size as a string": ("INVALID_ARGUMENT", "invalid value type for 'shared_memory_byte_size' parameter for tensor "
                                             "'A', expected int64_param."),
    "unknown region": ("NOT_FOUND", "Unable to find shared memory region: 'nowhere'"),
    "contents and a region": ("INVALID_ARGUMENT", "unexpected 'content' provided when using shared memory for input "
                                                  "tensor 'A' for model 'add_py'"),
    "output region without a size": ("INVALID_ARGUMENT", "'shared_memory_byte_size' must be specified along with "
                                                         "'shared_memory_region' parameter for tensor 'C'"),
    "classification as a string": ("INVALID_ARGUMENT", "invalid value type for 'classification' parameter, expected "
                                                       "int64_param"),
    "classification of 0": ("INVALID_ARGUMENT", "invalid value for 'classification' parameter, expected >= 0"),
    "classification and a region": ("INVALID_ARGUMENT", "output can't set both 'shared_memory_region' and "
                                                        "'classification'"),
}


def test_parameters_and_raw_contents_are_checked_as_triton_checks_them(server):
    from probes import grpc_parameter_cases, model_infer_answers

    cases = grpc_parameter_cases()
    answers = dict(zip(cases, model_infer_answers(server.grpc_url, list(cases.values()))))
    expected = dict(GRPC_PARAMETER_ANSWERS)
    # this server has client shared memory off (Triton has no such switch)
    expected["unknown region"] = ("UNAVAILABLE", "Client shared memory is disabled on this server; start it with "
                                                 "--allow-client-shm=true to use shared-memory regions")
    assert answers == expected
