"""The clients scripts/vllm/check.sh runs against Triton's vLLM backend served by tritonmp: each exits 0
when the answer is the one a vLLM model gives, else raises.

    python clients.py generate|generate_stream HTTP_ADDRESS GRPC_ADDRESS
    python clients.py grpc_stream HTTP_ADDRESS GRPC_ADDRESS
    python clients.py in_process MODEL_REPOSITORY BACKEND_DIRECTORY
    python clients.py openai BASE_URL
"""

from __future__ import annotations

import json
import sys
import urllib.request

PROMPT = "What is machine learning?"
MODEL = "vllm_model"


def _post(url: str, body: dict) -> bytes:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as r:
        assert r.status == 200, r.status
        return r.read()


def generate(http: str) -> None:
    answer = json.loads(_post(f"http://{http}/v2/models/{MODEL}/generate", {
        "text_input": PROMPT, "parameters": {"temperature": 0, "max_tokens": 8}}))
    print(answer)
    assert answer["model_name"] == MODEL and answer["text_output"].startswith(PROMPT)
    assert len(answer["text_output"]) > len(PROMPT)


def generate_stream(http: str) -> None:
    raw = _post(f"http://{http}/v2/models/{MODEL}/generate_stream", {
        "text_input": PROMPT, "stream": True, "parameters": {"temperature": 0, "max_tokens": 4}})
    events = [json.loads(line[6:]) for line in raw.decode().splitlines() if line.startswith("data: ")]
    print(events)
    assert len(events) >= 2 and all("text_output" in e for e in events)


def grpc_stream(grpc_address: str) -> None:
    import numpy as np
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(grpc_address)
    results: list = []
    client.start_stream(callback=lambda result, error: results.append(error or result))
    inputs = [grpcclient.InferInput("text_input", [1], "BYTES"), grpcclient.InferInput("stream", [1], "BOOL"),
              grpcclient.InferInput("sampling_parameters", [1], "BYTES")]
    inputs[0].set_data_from_numpy(np.array([PROMPT.encode()], dtype=np.object_))
    inputs[1].set_data_from_numpy(np.array([True]))
    inputs[2].set_data_from_numpy(np.array([json.dumps({"temperature": 0, "max_tokens": 4}).encode()],
                                           dtype=np.object_))
    client.async_stream_infer(MODEL, inputs, request_id="1", enable_empty_final_response=True)
    client.stop_stream()
    errors = [r for r in results if isinstance(r, Exception)]
    assert not errors, errors
    texts = [r.as_numpy("text_output")[0].decode() for r in results if r.as_numpy("text_output") is not None]
    print(texts)
    assert len(texts) >= 2
    assert results[-1].get_response().parameters["triton_final_response"].bool_param


def in_process(repository: str, backends: str) -> None:
    import ctypes

    import numpy as np

    from tritonmp import tritonserver

    server = tritonserver.Server(model_repository=repository, backend_directory=backends).start(
        wait_until_ready=True, timeout=300)
    try:
        model = server.model(MODEL)
        request = model.create_request(inputs={
            "text_input": [PROMPT], "stream": np.bool_([True]), "exclude_input_in_output": np.bool_([True]),
            "sampling_parameters": [json.dumps({"temperature": 0, "max_tokens": 4})],
            "return_num_input_tokens": np.bool_([True]), "return_num_output_tokens": np.bool_([True])})
        texts, counts = [], []
        for response in model.infer(request):
            tensor = response.outputs.get("text_output")
            if tensor is not None:  # read as Triton's OpenAI frontend reads it
                texts.append(ctypes.string_at(tensor.data_ptr + 4, tensor.size - 4).decode(errors="replace"))
            counts.append(response.outputs.get("num_input_tokens"))
        print(texts)
        assert len(texts) >= 2
        first = next(c for c in counts if c is not None)
        assert ctypes.cast(first.data_ptr, ctypes.POINTER(ctypes.c_uint32))[0] > 0
    finally:
        server.stop()


def openai_client(base_url: str) -> None:
    from openai import OpenAI

    client = OpenAI(base_url=base_url, api_key="EMPTY")
    models = [m.id for m in client.models.list().data]
    assert MODEL in models, models
    completion = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=6, temperature=0)
    print(completion)
    assert completion.choices[0].text and completion.usage.completion_tokens > 0
    chunks = list(client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=6, temperature=0, stream=True))
    assert len(chunks) >= 2 and "".join(c.choices[0].text for c in chunks) == completion.choices[0].text
    messages = [{"role": "user", "content": PROMPT}]
    chat = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=6, temperature=0)
    print(chat)
    assert chat.choices[0].message.role == "assistant" and chat.choices[0].message.content
    streamed = list(client.chat.completions.create(model=MODEL, messages=messages, max_tokens=6, temperature=0,
                                                   stream=True))
    text = "".join(c.choices[0].delta.content or "" for c in streamed if c.choices)
    assert text == chat.choices[0].message.content, (text, chat.choices[0].message.content)


def main() -> int:
    what = sys.argv[1]
    if what in ("generate", "generate_stream"):
        globals()[what](sys.argv[2])
    elif what == "grpc_stream":
        grpc_stream(sys.argv[3])
    elif what == "in_process":
        in_process(sys.argv[2], sys.argv[3])
    elif what == "openai":
        openai_client(sys.argv[2])
    else:
        raise SystemExit(f"unknown check {what}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
