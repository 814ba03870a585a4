"""An LLM's paths through the server, with the suite's stand-in for Triton's vLLM backend
(tests/backends/tokens: a python-based backend with the vLLM backend's inputs and outputs, decoupled,
streaming the words of its model.json's vocabulary as tokens): HTTP generate and generate_stream,
gRPC streaming, and the in-process API read as Triton's OpenAI frontend reads it (a request made from
the frontend's inputs, the text read from each BYTES tensor's serialized buffer through data_ptr and
size, the token counts through a ctypes cast). scripts/vllm/check.sh runs the real vLLM backend and
the real OpenAI frontend the same ways."""

from __future__ import annotations

import ctypes
import json
import shutil

import numpy as np
import orjson
import pytest
import tritonclient.grpc as grpcclient

from tritonmp import tritonserver

from conftest import TEST_BACKENDS, TEST_MODELS, serving

PROMPT = "What is machine learning?"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repo = tmp_path_factory.mktemp("llm")
    shutil.copytree(TEST_MODELS / "llm", repo / "llm")
    with serving([repo], [], tmp_path_factory) as s:
        yield s


def test_generate_and_generate_stream(server):
    body = {"text_input": PROMPT, "stream": False, "sampling_parameters": json.dumps({"max_tokens": 3}),
            "exclude_input_in_output": True, "return_num_input_tokens": True}
    status, _, raw = server.post("/v2/models/llm/generate", orjson.dumps(body))
    assert status == 200, raw
    answer = orjson.loads(raw)
    assert answer["text_output"] == " the quick brown" and answer["num_input_tokens"] == 4
    body = {**body, "exclude_input_in_output": False}
    status, _, raw = server.post("/v2/models/llm/generate", orjson.dumps(body))
    assert orjson.loads(raw)["text_output"] == PROMPT + " the quick brown"

    status, headers, raw = server.post("/v2/models/llm/generate_stream", orjson.dumps({**body, "stream": True}))
    assert status == 200 and headers["content-type"].startswith("text/event-stream")
    events = [orjson.loads(line[len(b"data: "):]) for line in raw.split(b"\n") if line.startswith(b"data: ")]
    assert [e["text_output"] for e in events] == [" the", " quick", " brown"]


def test_grpc_streaming(server):
    client = grpcclient.InferenceServerClient(server.grpc_url)
    responses: list = []
    client.start_stream(callback=lambda result, error: responses.append(error or result))
    inputs = [grpcclient.InferInput("text_input", [1], "BYTES"), grpcclient.InferInput("stream", [1], "BOOL"),
              grpcclient.InferInput("sampling_parameters", [1], "BYTES")]
    inputs[0].set_data_from_numpy(np.array([PROMPT.encode()], dtype=np.object_))
    inputs[1].set_data_from_numpy(np.array([True]))
    inputs[2].set_data_from_numpy(np.array([json.dumps({"max_tokens": 5}).encode()], dtype=np.object_))
    client.async_stream_infer("llm", inputs, request_id="7")
    client.stop_stream()
    assert [r.as_numpy("text_output")[0].decode() for r in responses] == [" the", " quick", " brown", " fox",
                                                                           " jumps"]
    assert {r.get_response().id for r in responses} == {"7"}


def _text(tensor) -> str:
    """A BYTES tensor's one element, read as Triton's OpenAI frontend reads it: past the 4-byte length
    at the start of its serialized buffer."""
    assert tensor.data_type == tritonserver.DataType.BYTES and tensor.size >= 4
    return ctypes.string_at(tensor.data_ptr + 4, tensor.size - 4).decode()


def _count(tensor) -> int:
    return ctypes.cast(tensor.data_ptr, ctypes.POINTER(ctypes.c_uint32))[0]


def test_in_process_as_the_openai_frontend_asks(tmp_path):
    server = tritonserver.Server(model_repository=str(TEST_MODELS), backend_directory=str(TEST_BACKENDS),
                                 model_control_mode=tritonserver.ModelControlMode.EXPLICIT, startup_models=["llm"])
    server.start(wait_until_ready=True, timeout=60)
    try:
        model = server.model("llm")
        assert model.transaction_properties() & tritonserver.ModelTxnPropertyFlag.DECOUPLED
        for stream in (False, True):  # the inputs the frontend's _create_vllm_generate_request makes
            inputs = {"text_input": [PROMPT], "stream": np.bool_([stream]), "exclude_input_in_output": np.bool_([True]),
                      "sampling_parameters": [json.dumps({"max_tokens": 2, "temperature": 0.0})],
                      "return_logprobs": np.bool_([False]), "return_num_input_tokens": np.bool_([True]),
                      "return_num_output_tokens": np.bool_([True])}
            responses = list(model.infer(model.create_request(inputs=inputs)))
            assert all(isinstance(r, tritonserver._api._response.InferenceResponse) for r in responses)
            texts = [_text(r.outputs["text_output"]) for r in responses]
            assert "".join(texts) == " the quick" and len(texts) == (2 if stream else 1)
            assert _count(responses[0].outputs["num_input_tokens"]) == 4
            assert sum(_count(r.outputs["num_output_tokens"]) for r in responses) == 2
            assert responses[-1].final
    finally:
        server.stop()
