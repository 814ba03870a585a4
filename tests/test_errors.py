"""Bad input gets Triton's status and message, and changes nothing for anyone else."""

import threading

import numpy as np
import orjson
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from conftest import add_inputs


def _add_body(a_shape=(1, 3), a_type="FP32", a_data=(1, 2, 3), with_b=True, **extra):
    inputs = [{"name": "A", "shape": list(a_shape), "datatype": a_type, "data": list(a_data)}]
    if with_b:
        rows = a_shape[0] if len(a_shape) == 2 else 1
        inputs.append({"name": "B", "shape": [rows, 3], "datatype": "FP32", "data": [4, 5, 6] * rows})
    return orjson.dumps({"inputs": inputs, **extra})


BAD = {
    "wrong dtype": ("/v2/models/add/infer", _add_body(a_type="FP64"), 400,
                    "inference input 'A' data-type is 'FP64', but model 'add' expects 'FP32'"),
    "wrong shape": ("/v2/models/add/infer", _add_body(a_shape=(1, 4), a_data=(1, 2, 3, 4)), 400,
                    "unexpected shape for input 'A' for model 'add'. Expected [-1,3], got [1,4]"),
    "missing input": ("/v2/models/add/infer", _add_body(with_b=False), 400,
                      "expected 2 inputs but got 1 inputs for model 'add'. Got input(s) ['A'], but missing "
                      "required input(s) ['B']"),
    "batch over max_batch_size": ("/v2/models/add/infer", _add_body(a_shape=(9, 3), a_data=[1] * 27), 400,
                                  "inference request batch-size must be <= 8 for 'add'"),
    "unknown model": ("/v2/models/nope/infer", _add_body(), 404, "Request for unknown model: 'nope' is not found"),
    "unknown version": ("/v2/models/add/versions/7/infer", _add_body(), 404,
                        "Request for unknown model: 'add' version 7 is not found"),
    "malformed JSON": ("/v2/models/add/infer", b'{"inputs": [{"name": "A"', 400,
                       "failed to parse the request JSON buffer"),
    # the model is looked up before the body is read, as Triton does: these are about the model
    "unknown model, malformed JSON": ("/v2/models/nope/infer", b'{"inputs": [', 404,
                                      "Request for unknown model: 'nope' is not found"),
    "unknown model, bad datatype": ("/v2/models/nope/infer", _add_body(a_type="FP3"), 404,
                                    "Request for unknown model: 'nope' is not found"),
    "unknown version, malformed JSON": ("/v2/models/add/versions/7/infer", b"{", 404,
                                        "Request for unknown model: 'add' version 7 is not found"),
    "version that is no number": ("/v2/models/add/versions/one/infer", _add_body(), 404, "Not Found"),
    "version with a leading zero": ("/v2/models/add/versions/07/infer", _add_body(), 404,
                                    "Request for unknown model: 'add' version 7 is not found"),
    "version past 64 bits": ("/v2/models/add/versions/9223372036854775808/infer", b"{", 400,
                             "failed to get model version from specified version string '9223372036854775808' "
                             "(details: stol), version should be an integral value > 0"),
    "an input too many": ("/v2/models/add/infer", orjson.dumps({"inputs": orjson.loads(_add_body())["inputs"] + [
        {"name": "Q", "shape": [1, 3], "datatype": "FP32", "data": [1, 2, 3]}]}), 400,
        "expected 2 inputs but got 3 inputs for model 'add'. Got input(s) ['A','B','Q'], but missing required "
        "input(s) ]. Please provide all required input(s)."),  # Triton's "]" when none is missing
    "unknown output": ("/v2/models/add/infer", _add_body(outputs=[{"name": "Q"}]), 400,
                       "unexpected inference output 'Q' for model 'add'"),
    "data shorter than shape": ("/v2/models/add/infer", _add_body(a_data=(1, 2)), 400,
                                "Unable to parse 'data': Shape does not match true shape of 'data' field"),
    "data longer than shape": ("/v2/models/add/infer", _add_body(a_data=(1, 2, 3, 4)), 400,
                               "Unable to parse 'data': Shape does not match true shape of 'data' field"),
    "non-numeric data": ("/v2/models/add/infer", _add_body(a_data=(1, 2, "x")), 400, "Unable to parse 'data'"),
    "unknown datatype": ("/v2/models/add/infer", _add_body(a_type="FP3"), 400, "invalid datatype for input A"),
    "request id in message": ("/v2/models/add/infer", _add_body(a_type="INT8", id="req-9"), 400,
                              "[request id: req-9] inference input 'A'"),
    "parameter of Triton's own": ("/v2/models/add/infer", _add_body(parameters={"triton_x": 1}), 400,
                                  "parameter keys starting with 'triton_' are reserved for Triton usage and should not "
                                  "be specified."),
}


def _good_traffic(url, stop, failures, count):
    client = httpclient.InferenceServerClient(url=url)
    a = np.ones((2, 3), dtype=np.float32)
    inputs = add_inputs(httpclient, a)
    while not stop.is_set():
        try:
            np.testing.assert_array_equal(client.infer("add", inputs).as_numpy("C"), a + a)
            count[0] += 1
        except Exception as e:  # any failure of a good request fails the test
            failures.append(e)
    client.close()  # in this thread, not in the collector's


@pytest.fixture
def good_traffic(server):
    stop, failures, count = threading.Event(), [], [0]
    thread = threading.Thread(target=_good_traffic, args=(server.url, stop, failures, count))
    thread.start()
    yield
    stop.set()
    thread.join()
    assert not failures, failures[:3]
    assert count[0] > 0


@pytest.mark.parametrize("case", list(BAD))
def test_bad_request_gets_status_and_message(server, good_traffic, case):
    path, body, status, message = BAD[case]
    got_status, headers, raw = server.post(path, body)
    assert got_status == status, raw
    assert message in orjson.loads(raw)["error"]


def test_binary_data_size_past_the_body_is_rejected(server, good_traffic):
    head = orjson.dumps({"inputs": [
        {"name": "A", "shape": [1, 3], "datatype": "FP32", "parameters": {"binary_data_size": 12}},
        {"name": "B", "shape": [1, 3], "datatype": "FP32", "parameters": {"binary_data_size": 12}}]})
    body = head + np.ones(3, np.float32).tobytes()
    status, _, raw = server.post("/v2/models/add/infer", body,
                                 {"Inference-Header-Content-Length": str(len(head))})
    assert status == 400
    assert "binary_data_size" in orjson.loads(raw)["error"]


def test_binary_data_of_the_wrong_size_is_rejected(server, good_traffic):
    head = orjson.dumps({"inputs": [
        {"name": "A", "shape": [1, 3], "datatype": "FP32", "parameters": {"binary_data_size": 8}},
        {"name": "B", "shape": [1, 3], "datatype": "FP32", "parameters": {"binary_data_size": 12}}]})
    body = head + np.ones(2, np.float32).tobytes() + np.ones(3, np.float32).tobytes()
    status, _, raw = server.post("/v2/models/add/infer", body,
                                 {"Inference-Header-Content-Length": str(len(head))})
    assert status == 400
    assert "input byte size mismatch for input 'A' for model 'add'. Expected 12, got 8" in orjson.loads(raw)["error"]


def test_tritonclient_sees_the_error_message(server):
    client = httpclient.InferenceServerClient(url=server.url)
    a = np.ones((1, 3), dtype=np.float64)
    inputs = add_inputs(httpclient, a)
    with pytest.raises(InferenceServerException, match="data-type is 'FP64', but model 'add' expects 'FP32'"):
        client.infer("add", inputs)


def test_wrong_method_and_unknown_route(server):
    assert server.get("/v2/models/add/infer")[0] == 405
    status, _, raw = server.get("/v2/nothing/here")
    assert status == 404 and orjson.loads(raw) == {"error": "Not Found"}


def test_model_that_raises_fails_only_its_request(server, good_traffic):
    status, _, raw = server.post("/v2/models/fail/infer", orjson.dumps(
        {"inputs": [{"name": "X", "shape": [1], "datatype": "FP32", "data": [0]}]}))
    assert status == 500
    assert "TritonModelException: the model refused X = 0" in orjson.loads(raw)["error"]
    status, _, raw = server.post("/v2/models/fail/infer", orjson.dumps(
        {"inputs": [{"name": "X", "shape": [1], "datatype": "FP32", "data": [5]}]}))
    assert status == 200, raw


def test_model_error_response_keeps_its_status(server):
    status, _, raw = server.post("/v2/models/fail/infer", orjson.dumps(
        {"inputs": [{"name": "X", "shape": [1], "datatype": "FP32", "data": [1]}]}))
    assert status == 400
    assert orjson.loads(raw)["error"] == "X = 1 is not a valid input"


def test_a_models_unknown_error_stays_unknown(server):
    """UNKNOWN and INVALID_ARG share HTTP 400 but are different codes: gRPC tells them apart."""
    x = grpcclient.InferInput("X", [1], "FP32")
    for value, code in ((3, "StatusCode.UNKNOWN"), (1, "StatusCode.INVALID_ARGUMENT")):
        x.set_data_from_numpy(np.array([value], np.float32))
        with pytest.raises(InferenceServerException) as e:
            grpcclient.InferenceServerClient(server.grpc_url).infer("fail", [x])
        assert e.value.status() == code
    status, _, raw = server.post("/v2/models/fail/infer", orjson.dumps(
        {"inputs": [{"name": "X", "shape": [1], "datatype": "FP32", "data": [3]}]}))
    assert (status, orjson.loads(raw)["error"]) == (400, "X = 3 is a mystery")


def test_a_python_models_output_of_another_datatype_goes_as_it_made_it(server):
    """As Triton 2.51 answers (checked against it): a python model's FP64 output for a TYPE_FP32 one is
    sent as FP64, over HTTP and gRPC alike."""
    status, _, raw = server.post("/v2/models/fail/infer", orjson.dumps(
        {"inputs": [{"name": "X", "shape": [1], "datatype": "FP32", "data": [2]}]}))
    assert status == 200
    assert orjson.loads(raw)["outputs"] == [{"name": "Y", "datatype": "FP64", "shape": [1], "data": [2.0]}]
    x = grpcclient.InferInput("X", [1], "FP32")
    x.set_data_from_numpy(np.array([2], np.float32))
    result = grpcclient.InferenceServerClient(server.grpc_url).infer("fail", [x])
    assert result.as_numpy("Y").dtype == np.float64 and result.as_numpy("Y").tolist() == [2.0]


def test_model_output_that_is_not_a_tensor_is_an_error(server):
    status, _, raw = server.post("/v2/models/fail/infer", orjson.dumps(
        {"inputs": [{"name": "X", "shape": [1], "datatype": "FP32", "data": [4]}]}))
    assert status == 500
    # refused where it is made, as Triton's bindings refuse it: the model's execute() raises
    assert orjson.loads(raw)["error"] == ("Failed to process the request(s) for model 'fail_0', message: TypeError: "
                                          "InferenceResponse(): incompatible arguments: output_tensors[] must be "
                                          "Tensor, got ndarray")
    status, _, raw = server.post("/v2/models/fail/infer", orjson.dumps(
        {"inputs": [{"name": "X", "shape": [1], "datatype": "FP32", "data": [5]}]}))
    assert status == 200, raw


OPTIONAL_MODEL = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", np.zeros(1, np.float32)),
                                            pb_utils.Tensor("OUTPUT1", np.zeros(1, np.float32))])
                for _ in requests]
"""


def write_optional_model(repo) -> None:
    """input_optional: inputs INPUT0..INPUT2 required and INPUT3 optional, as in Triton's own tests."""
    from conftest import write_model

    tensors = ", ".join(f'{{ name: "INPUT{i}", data_type: TYPE_FP32, dims: [ 1 ]'
                        f'{" optional: true" if i == 3 else ""} }}' for i in range(4))
    write_model(repo, "input_optional", OPTIONAL_MODEL,
                f'backend: "python"\nmax_batch_size: 0\ninput [ {tensors} ]\n'
                'output [ { name: "OUTPUT0", data_type: TYPE_FP32, dims: [ 1 ] }, '
                '{ name: "OUTPUT1", data_type: TYPE_FP32, dims: [ 1 ] } ]\n')


def test_missing_inputs_of_a_model_with_optional_ones_and_an_output_asked_twice(start_server, tmp_path):
    write_optional_model(tmp_path / "repo")
    server = start_server([tmp_path / "repo"])
    x = grpcclient.InferInput("INPUT0", [1], "FP32")
    x.set_data_from_numpy(np.zeros(1, np.float32))
    client = grpcclient.InferenceServerClient(server.grpc_url)
    with pytest.raises(InferenceServerException) as e:
        client.infer("input_optional", [x])
    assert ("expected number of inputs between 3 and 4 but got 1 inputs for model 'input_optional'. Got input(s) "
            "['INPUT0'], but missing required input(s) ['INPUT1','INPUT2']. Please provide all required "
            "input(s).") in e.value.message()
    inputs = []
    for i in range(3):
        t = grpcclient.InferInput(f"INPUT{i}", [1], "FP32")
        t.set_data_from_numpy(np.zeros(1, np.float32))
        inputs.append(t)
    assert client.infer("input_optional", inputs).as_numpy("OUTPUT0") is not None  # the optional one may be left out
    twice = [grpcclient.InferRequestedOutput("OUTPUT0"), grpcclient.InferRequestedOutput("OUTPUT0")]
    with pytest.raises(InferenceServerException, match="output 'OUTPUT0' is requested more than once"):
        client.infer("input_optional", inputs, outputs=twice)


JSON_PARAMETER_ERRORS = {  # Triton 2.51's words; it answers 500 for these, tritonmp 400 (the README says why)
    "priority as a string": "Unable to parse 'priority': attempt to access JSON non-unsigned-integer as "
                            "unsigned-integer",
    "negative priority": "Unable to parse 'priority': attempt to access JSON non-unsigned-integer as unsigned-integer",
    "timeout as a float": "Unable to parse 'timeout': attempt to access JSON non-unsigned-integer as unsigned-integer",
    "sequence_id as a bool": "Unable to parse 'sequence_id': attempt to access JSON non-string as string",
    "sequence_start as an int": "Unable to parse 'sequence_start': attempt to access JSON non-boolean as boolean",
    "binary_data_output as a string": "Unable to parse 'binary_data_output': attempt to access JSON non-boolean as "
                                      "boolean",
    "a model's parameter as a list": "parameter 'custom' has invalid type. It should be either 'int', 'bool', or "
                                     "'string'.",
    "a model's parameter as null": "parameter 'custom' has invalid type. It should be either 'int', 'bool', or "
                                   "'string'.",
    "parameters as a list": "failed to get request params.: attempt to get members for non-object",
    "binary_data as a string": "Unable to parse 'binary_data': attempt to access JSON non-boolean as boolean",
    "classification as a float": "Unable to set 'classification': attempt to access JSON non-unsigned-integer as "
                                 "unsigned-integer",
    "classification and a region": "Output can't set both 'shared_memory_region' and 'classification'",
    "region as an int": "Unable to parse 'shared_memory_region': attempt to access JSON non-string as string",
    "negative offset": "Unable to parse 'shared_memory_offset': attempt to access JSON non-unsigned-integer as "
                       "unsigned-integer",
    "binary_data_size as a string": "Unable to parse 'binary_data_size': attempt to access JSON non-unsigned-integer "
                                    "as unsigned-integer",
}


def test_parameters_of_a_type_triton_does_not_take_are_refused_in_its_words(server, good_traffic):
    from probes import json_parameter_cases

    cases = json_parameter_cases()
    assert set(cases) == set(JSON_PARAMETER_ERRORS)
    for name, body in cases.items():
        status, _, raw = server.post("/v2/models/add_py/infer", body)
        assert (status, orjson.loads(raw)) == (400, {"error": JSON_PARAMETER_ERRORS[name]}), name


def test_input_parameters_that_are_not_an_object_are_none(server):
    """As Triton reads them (a JSON encoder may write an empty map as [])."""
    for params in ([], [1], "x"):
        body = orjson.dumps({"inputs": [{"name": "A", "shape": [1, 3], "datatype": "FP32", "data": [1, 2, 3],
                                         "parameters": params},
                                        {"name": "B", "shape": [1, 3], "datatype": "FP32", "data": [4, 5, 6]}]})
        status, _, raw = server.post("/v2/models/add_py/infer", body)
        assert status == 200 and orjson.loads(raw)["outputs"][0]["data"] == [5, 7, 9], params
