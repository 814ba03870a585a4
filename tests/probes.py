"""Probes of protocol behaviour that the suite asks of tritonmp and test_compat.py asks of the
reference Triton too, so that both answer the same questions: gRPC stream final flags, ModelInfer
answers, mixed contents, reserved and typed parameters, raw binary requests, and the response
sender patterns of python models."""

from __future__ import annotations

import http.client
import shutil
from pathlib import Path

from conftest import EXAMPLE_REPO, TEST_MODELS, add_inputs, http_request, write_model


def stream_final_flags(grpc_url: str, add_model: str = "add_py", decoupled: str = "repeat") -> list[tuple]:
    """Requests over one ModelStreamInfer stream to an add model and a decoupled model that answers N
    with N responses, each with and without `triton_enable_empty_final_response`; per response, what a
    stream consumer sees: (request id, model, output names, its triton_final_response flag)."""
    import queue

    import numpy as np
    import tritonclient.grpc as grpcclient

    def n(count):
        x = grpcclient.InferInput("N", [1], "INT32")
        x.set_data_from_numpy(np.array([count], np.int32))
        return [x]

    cases = [(add_model, add_inputs(grpcclient, np.ones((1, 3), np.float32)), False, 1),
             (add_model, add_inputs(grpcclient, np.ones((1, 3), np.float32)), True, 1),
             (decoupled, n(2), False, 2), (decoupled, n(2), True, 3), (decoupled, n(0), True, 1)]
    client = grpcclient.InferenceServerClient(grpc_url)
    results: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    seen = []
    try:
        for i, (model, inputs, empty_final, count) in enumerate(cases):
            client.async_stream_infer(model, inputs, request_id=f"r{i}", enable_empty_final_response=empty_final)
            for _ in range(count):
                result, error = results.get(timeout=30)
                assert error is None, error
                response = result.get_response()
                final = response.parameters["triton_final_response"].bool_param
                seen.append((response.id, response.model_name, [o.name for o in response.outputs], final))
    finally:
        client.stop_stream()
    return seen


def model_infer_answers(grpc_url: str, requests: list) -> list[tuple]:
    """(status, message) of each ModelInferRequest sent in turn: ("OK", "") for a success."""
    import grpc
    from tritonclient.grpc import service_pb2_grpc as rpc

    answers = []
    with grpc.insecure_channel(grpc_url) as channel:
        stub = rpc.GRPCInferenceServiceStub(channel)
        for request in requests:
            try:
                stub.ModelInfer(request, timeout=30)
                answers.append(("OK", ""))
            except grpc.RpcError as e:
                answers.append((e.code().name, e.details()))
    return answers


def mixed_contents_errors(grpc_url: str, model: str = "add_py") -> list[tuple]:
    """ModelInfer requests to an add model that set raw_input_contents and an input's typed contents
    too (for the same input, for another, or an empty contents field): (status, message) of each."""
    import numpy as np
    from tritonclient.grpc import service_pb2 as pb

    raw = np.ones(3, np.float32).tobytes()
    requests = []
    for variant in ("same input", "another input", "empty contents"):
        request = pb.ModelInferRequest(model_name=model)
        a = request.inputs.add(name="A", datatype="FP32", shape=[1, 3])
        request.inputs.add(name="B", datatype="FP32", shape=[1, 3])
        if variant == "empty contents":
            a.contents.SetInParent()
        else:
            a.contents.fp32_contents.extend([1, 1, 1])
        request.raw_input_contents.extend([raw] if variant == "another input" else [raw, raw])
        requests.append(request)
    return model_infer_answers(grpc_url, requests)


def reserved_parameter_answers(grpc_url: str, model: str = "add_py") -> list[tuple]:
    """ModelInfer requests to an add model with a request parameter of Triton's own (a `triton_`
    key): an unknown one, the one Triton takes with a value of the wrong type, and that one as a
    bool: (status, message) of each."""
    import numpy as np
    from tritonclient.grpc import service_pb2 as pb

    raw = np.ones(3, np.float32).tobytes()
    empty_final = "triton_enable_empty_final_response"
    requests = []
    for key, kind, value in (("triton_foo", "int64_param", 1), (empty_final, "int64_param", 3),
                             (empty_final, "bool_param", True)):
        request = pb.ModelInferRequest(model_name=model)
        for name in "AB":
            request.inputs.add(name=name, datatype="FP32", shape=[1, 3])
        request.raw_input_contents.extend([raw, raw])
        setattr(request.parameters[key], kind, value)
        requests.append(request)
    return model_infer_answers(grpc_url, requests)


def grpc_parameter_cases(model: str = "add_py") -> dict:
    """ModelInfer requests to an add model whose parameters (the request's, an input's, a requested
    output's) or raw contents Triton checks before running it: name -> request."""
    import numpy as np
    from tritonclient.grpc import service_pb2 as pb

    def add(raw_count=2, **params):
        request = pb.ModelInferRequest(model_name=model)
        for name in "AB":
            request.inputs.add(name=name, datatype="FP32", shape=[1, 3])
        request.raw_input_contents.extend([np.ones(3, np.float32).tobytes()] * raw_count)
        for key, value in params.items():
            request.parameters[key].CopyFrom(pb.InferParameter(**value))
        return request

    def with_input_params(request, **params):
        for key, value in params.items():
            request.inputs[0].parameters[key].CopyFrom(pb.InferParameter(**value))
        return request

    def with_contents(request):
        request.inputs[0].contents.fp32_contents.extend([1, 2, 3])
        return request

    def with_output(request, **params):
        request.outputs.add(name="C", parameters={k: pb.InferParameter(**v) for k, v in params.items()})
        return request

    region, size = {"string_param": "nowhere"}, {"int64_param": 12}
    return {
        "priority as a string": add(priority={"string_param": "1"}),
        "negative priority": add(priority={"int64_param": -1}),
        "priority as uint64": add(priority={"uint64_param": 0}),
        "timeout as a string": add(timeout={"string_param": "1"}),
        "sequence_id as a bool": add(sequence_id={"bool_param": True}),
        "sequence_start as an int": add(sequence_start={"int64_param": 1}),
        "sequence_end as a string": add(sequence_end={"string_param": "x"}),
        "a model's parameter as uint64": add(custom={"uint64_param": 1}),
        "a model's parameter as a double": add(custom={"double_param": 1.5}),
        "more raw contents than inputs": add(raw_count=3),
        "raw contents for one input of two": add(raw_count=1),
        "no data at all": add(raw_count=0),
        "region without a size": with_input_params(add(1), shared_memory_region=region),
        "size without a region": with_input_params(add(), shared_memory_byte_size=size),
        "offset without a region": with_input_params(add(), shared_memory_offset=size),
        "region as an int": with_input_params(add(1), shared_memory_region=size, shared_memory_byte_size=size),
        "size as a string": with_input_params(add(1), shared_memory_region=region, shared_memory_byte_size=region),
        "unknown region": with_input_params(add(1), shared_memory_region=region, shared_memory_byte_size=size),
        "contents and a region": with_contents(with_input_params(add(0), shared_memory_region=region,
                                                                 shared_memory_byte_size=size)),
        "output region without a size": with_output(add(), shared_memory_region=region),
        "classification as a string": with_output(add(), classification={"string_param": "2"}),
        "classification of 0": with_output(add(), classification={"int64_param": 0}),
        "classification and a region": with_output(add(), classification={"int64_param": 1},
                                                   shared_memory_region=region, shared_memory_byte_size=size),
    }


def json_parameter_cases() -> dict:
    """HTTP infer bodies for an add model whose parameters hold values of a type Triton does not
    take: name -> body."""
    import orjson

    def add(parameters=None, a_params=None, outputs=None):
        a = {"name": "A", "shape": [1, 3], "datatype": "FP32"}
        if a_params is None:
            a["data"] = [1, 2, 3]
        else:
            a["parameters"] = a_params
        doc = {"inputs": [a, {"name": "B", "shape": [1, 3], "datatype": "FP32", "data": [4, 5, 6]}]}
        if parameters is not None:
            doc["parameters"] = parameters
        if outputs is not None:
            doc["outputs"] = [{"name": "C", "parameters": outputs}]
        return orjson.dumps(doc)

    return {
        "priority as a string": add({"priority": "1"}),
        "negative priority": add({"priority": -1}),
        "timeout as a float": add({"timeout": 1.5}),
        "sequence_id as a bool": add({"sequence_id": True}),
        "sequence_start as an int": add({"sequence_start": 1}),
        "binary_data_output as a string": add({"binary_data_output": "yes"}),
        "a model's parameter as a list": add({"custom": [1]}),
        "a model's parameter as null": add({"custom": None}),
        "parameters as a list": add([1]),
        "binary_data as a string": add(outputs={"binary_data": "yes"}),
        "classification as a float": add(outputs={"classification": 1.5}),
        "classification and a region": add(outputs={"classification": 1, "shared_memory_region": "r",
                                                    "shared_memory_byte_size": 12}),
        "region as an int": add(a_params={"shared_memory_region": 3, "shared_memory_byte_size": 12}),
        "negative offset": add(a_params={"shared_memory_region": "r", "shared_memory_offset": -4,
                                         "shared_memory_byte_size": 12}),
        "binary_data_size as a string": add(a_params={"binary_data_size": "12"}),
    }


RAW_MODEL = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "X").as_numpy()
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", x),
                                                   pb_utils.Tensor("SHAPE", np.array(x.shape, np.int64))]))
        return out
"""
# name -> (max_batch_size, data type, dims) of single-input models that echo X and its shape
RAW_MODELS = {"one_var": (0, "TYPE_FP32", "[ -1 ]"), "fixed_b": (4, "TYPE_FP32", "[ 3 ]"),
              "var_b": (4, "TYPE_FP32", "[ 2, -1 ]"), "two_var": (0, "TYPE_FP32", "[ -1, -1 ]"),
              "bytes1": (0, "TYPE_STRING", "[ 1 ]"), "bytes2": (0, "TYPE_STRING", "[ 2 ]"),
              "bytes1b": (4, "TYPE_STRING", "[ 1 ]")}


def raw_binary_repo(root: Path) -> Path:
    """A repository of RAW_MODELS and the two-input add_py."""
    for name, (batch, dtype, dims) in RAW_MODELS.items():
        write_model(root, name, RAW_MODEL,
                    f'backend: "python"\nmax_batch_size: {batch}\n'
                    f'input [ {{ name: "X", data_type: {dtype}, dims: {dims} }} ]\n'
                    f'output [ {{ name: "Y", data_type: {dtype}, dims: {dims} }}, '
                    '{ name: "SHAPE", data_type: TYPE_INT64, dims: [ -1 ] } ]\n')
    shutil.copytree(EXAMPLE_REPO / "add_py", root / "add_py")
    return root


def raw_binary_answers(port: int) -> list[tuple]:
    """Raw binary requests (Inference-Header-Content-Length: 0) to raw_binary_repo's models:
    (model, body length, status, content type, JSON header or error, binary tail) for each."""
    import numpy as np

    f = np.arange(6, dtype=np.float32).tobytes()
    cases = [("one_var", f), ("fixed_b", f[:12]), ("fixed_b", f), ("var_b", f[:16]), ("var_b", f[:12]),
             ("two_var", f), ("bytes1", b"hello"), ("bytes2", b"hello"), ("bytes1b", b"hello"), ("add_py", f),
             ("one_var", b"abc"), ("one_var", b"")]
    raw = {"Inference-Header-Content-Length": "0"}
    out = []
    for model, body in cases:
        status, headers, data = http_request(port, "POST", f"/v2/models/{model}/infer", body, raw)
        split = int(headers.get("inference-header-content-length", len(data)))
        out.append((model, len(body), status, headers.get("content-type"), data[:split].decode(), data[split:]))
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:  # the same, chunked
        conn.request("POST", "/v2/models/one_var/infer", body=iter([f[:8], f[8:]]), headers=raw, encode_chunked=True)
        response = conn.getresponse()
        data = response.read()
        split = int(response.getheader("inference-header-content-length", len(data)))
        out.append(("chunked", len(f), response.status, response.getheader("content-type"), data[:split].decode(),
                    data[split:]))
    finally:
        conn.close()
    return out


# The response sender in every pattern: (responses before return, final flag before return, return a
# response, responses after return, final flag after return), as Triton's own response-sender test
# names them.
SENDER_PATTERNS = {
    "zero_pre": (0, True, False, 0, False),
    "zero_post": (0, False, False, 0, True),
    "one_pre": (1, True, False, 0, False),
    "one_post": (0, False, False, 1, True),
    "two_pre": (2, True, False, 0, False),
    "two_post": (0, False, False, 2, True),
    "pre_and_post": (1, False, False, 3, True),
    "on_return": (0, False, True, 0, False),
    "pre_and_on": (1, True, True, 0, False),
    "on_and_post": (0, False, True, 1, True),
}


def response_sender_repo(root: Path) -> Path:
    """The response_sender model in its eight variants: decoupled or not, `def` or `async def
    execute`, alone or dynamically batched (so that several requests share one execute call)."""
    source = TEST_MODELS / "response_sender"
    base = (source / "config.pbtxt").read_text().replace('name: "response_sender"\n', "")
    for decoupled in (False, True):
        for use_async in (False, True):
            for batching in (False, True):
                name = "response_sender" + "_decoupled" * decoupled + "_async" * use_async + "_batching" * batching
                shutil.copytree(source / "1", root / name / "1")
                config = base
                if decoupled:
                    config += "model_transaction_policy { decoupled: true }\n"
                if use_async:
                    config += 'default_model_filename: "model_async.py"\n'
                if batching:
                    config += "dynamic_batching { max_queue_delay_microseconds: 500000 }\n"
                (root / name / "config.pbtxt").write_text(config)
    return root


def sender_pattern_inputs(module, pattern: str) -> list:
    """The response_sender model's five inputs for a pattern, for tritonclient `module` (http or grpc)."""
    import numpy as np

    names = ["NUMBER_OF_RESPONSE_BEFORE_RETURN", "SEND_COMPLETE_FINAL_FLAG_BEFORE_RETURN", "RETURN_A_RESPONSE",
             "NUMBER_OF_RESPONSE_AFTER_RETURN", "SEND_COMPLETE_FINAL_FLAG_AFTER_RETURN"]
    inputs = []
    for name, value in zip(names, SENDER_PATTERNS[pattern]):
        is_bool = isinstance(value, bool)
        x = module.InferInput(name, [1, 1], "BOOL" if is_bool else "UINT8")
        x.set_data_from_numpy(np.array([[value]], bool if is_bool else np.uint8))
        inputs.append(x)
    return inputs


def response_sender_outcome(grpc_url: str, model: str, patterns: list[str], timeout: float = 30.0):
    """Requests of the given patterns over one tritonclient gRPC stream, closed the way Triton's test
    closes it (stop_stream, which waits for every request's final response): what came back, as a
    sorted tuple of 'returned', 'before', 'after' or 'error: <message>' per response, or 'hung'
    when the stream had not ended after `timeout` seconds."""
    import threading

    import tritonclient.grpc as grpcclient

    seen: list[str] = []

    def callback(result, error):
        if error is not None:
            seen.append(f"error: {error.message()}")
            return
        index = result.as_numpy("INDEX")
        response_id = index.sum() // index.shape[0]
        seen.append("returned" if response_id < 1000 else "before" if response_id < 2000 else "after")

    client = grpcclient.InferenceServerClient(grpc_url)
    client.start_stream(callback)
    for pattern in patterns:
        client.async_stream_infer(model, sender_pattern_inputs(grpcclient, pattern))
    stopper = threading.Thread(target=client.stop_stream, daemon=True)
    stopper.start()
    stopper.join(timeout)
    if stopper.is_alive():
        client.stop_stream(cancel_requests=True)
        return ("hung", *sorted(seen))
    client.close()
    return tuple(sorted(seen))
