"""The generate extension: flat JSON in and out, and server-sent events from a decoupled model."""

import http.client

import orjson

from conftest import http_request


def test_generate_maps_keys_to_inputs_and_outputs_to_keys(server):
    body = orjson.dumps({"id": "g1", "A": [1, 2, 3], "B": [4, 5, 6]})
    status, _, raw = http_request(server.http_port, "POST", "/v2/models/add_py/generate", body)
    assert status == 200, raw
    assert orjson.loads(raw) == {"model_name": "add_py", "model_version": "1", "id": "g1", "C": [5.0, 7.0, 9.0]}


def test_generate_errors(server):
    status, _, raw = http_request(server.http_port, "POST", "/v2/models/add_py/generate",
                                  orjson.dumps({"A": [1, 2, 3]}))
    assert (status, orjson.loads(raw)["error"]) == (400, "[request id: <id_unknown>] expected 2 inputs but got 1 "
                                                         "inputs for model 'add_py'. Got input(s) ['A'], but missing "
                                                         "required input(s) ['B']. Please provide all required "
                                                         "input(s).")
    status, _, raw = http_request(server.http_port, "POST", "/v2/models/repeat/generate", orjson.dumps({"N": 2}))
    assert status == 400 and orjson.loads(raw)["error"] == ("generate expects model to produce exactly 1 response, "
                                                           "use generate stream for model that generates various "
                                                           "number of responses")


TEXT_MODEL = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            prompt = pb_utils.get_input_tensor_by_name(r, "PROMPT").as_numpy()[0]
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor(
                "TEXT", np.array([prompt + b"|" + r.parameters().encode()], dtype=object))]))
        return out
"""
TEXT_CONFIG = ('backend: "python"\nmax_batch_size: 0\n'
               'input [ { name: "PROMPT", data_type: TYPE_STRING, dims: [ 1 ] }, '
               '{ name: "OPT", data_type: TYPE_INT32, dims: [ 1 ], optional: true } ]\n'
               'output [ { name: "TEXT", data_type: TYPE_STRING, dims: [ 1 ] } ]\n')
GENERATE_CASES = [
    ("textm/generate", b'{"PROMPT":"hi","REPETITION":3,"FLAG":true,"NAME":"x"}'),
    ("textm/generate", b'{"PROMPT":"hi","PARAMS":{"a":1}}'), ("textm/generate", b'{"PROMPT":"hi","PARAMS":[1]}'),
    ("textm/generate", b'{"PROMPT":123}'), ("textm/generate", b'{"PROMPT":"a","PROMPT":"b"}'),
    ("textm/generate", b"{}"), ("add_py/generate", b'{"A":[1,2,3]}'),
    ("add_py/generate", b'{"A":["x","y","z"],"B":[1,2,3]}'), ("textm/generate_stream", b'{"PROMPT":"hi"}'),
    ("fail/generate_stream", b'{"X":[1]}'), ("fail/generate", b'{"X":[1]}'),
    ("repeat/generate_stream", b'{"N":[-1]}'), ("repeat/generate_stream", b'{"N":[0]}'),
    ("repeat/generate_stream", b'{"N":[2]}'),
    ("textm/generate", b'{"PROMPT":"hi","parameters":1}'),
    ("textm/generate", b'{"PROMPT":"hi","parameters":{"nested":{"twice":1}}}'),
    ("textm/generate", b'{"PROMPT":"hi","parameters":{"REPETITION":2}}'),
    ("repeat/generate", b'{"N":[0]}'), ("repeat/generate", b'{"N":[2]}'), ("repeat/generate", b'{"N":[1]}'),
]


def generate_repo(root, test_repo, example_repo):
    import shutil

    from conftest import write_model

    write_model(root, "textm", TEXT_MODEL, TEXT_CONFIG)
    for name, repo in (("fail", test_repo), ("repeat", test_repo), ("add_py", example_repo)):
        shutil.copytree(repo / name, root / name)
    return root


def generate_answers(port: int) -> list[tuple]:
    """(path, status, content type, body) of each of GENERATE_CASES."""
    out = []
    for path, body in GENERATE_CASES:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        try:
            conn.request("POST", "/v2/models/" + path, body=body)
            response = conn.getresponse()
            out.append((path, response.status, response.getheader("content-type"), response.read().decode()))
        finally:
            conn.close()
    return out


def test_generate_as_triton_reads_it(start_server, tmp_path, test_repo, example_repo):
    server = start_server([generate_repo(tmp_path / "repo", test_repo, example_repo)])
    answers = generate_answers(server.http_port)
    # keys that are not inputs are request parameters the model reads (Triton's mock LLM takes REPETITION so)
    assert answers[0][1:] == (200, "application/json", '{"TEXT":"hi|{\\"REPETITION\\":3,\\"FLAG\\":true,'
                                                       '\\"NAME\\":\\"x\\"}","model_name":"textm",'
                                                       '"model_version":"1"}')
    invalid_type = "parameter 'PARAMS' has invalid type. It should be either 'int', 'bool', or 'string'."
    assert orjson.loads(answers[1][3])["error"] == orjson.loads(answers[2][3])["error"] == invalid_type
    assert "attempt to access JSON non-string as string" in answers[3][3]  # 123 is not the string "123"
    assert answers[4][1:3] == (400, "application/json") and "input 'PROMPT' already exists" in answers[4][3]
    assert "expected number of inputs between 1 and 2 but got 0 inputs" in answers[5][3]
    assert answers[8][1:3] == (200, "text/event-stream; charset=utf-8")
    # an error from the model once the stream is asked for: an event, with the model's status
    assert answers[9][1:] == (400, "text/event-stream; charset=utf-8",
                              'data: {"error":"X = 1 is not a valid input"}\n\n')
    assert answers[12][1:] == (200, "text/event-stream; charset=utf-8", "")  # zero responses
    # parameters: a JSON object of strings, integers and booleans, in Triton's words otherwise
    assert orjson.loads(answers[14][3])["error"] == ("Expected JSON object for keyword: 'parameters': attempt to "
                                                     "access JSON non-object as object")
    assert orjson.loads(answers[15][3])["error"] == ("Converting keyword: 'parameters': parameter 'nested' has "
                                                     "invalid type. It should be either 'int', 'bool', or 'string'.")
    assert answers[16][1] == 200 and "REPETITION" in answers[16][3]
    one_only = "generate expects model to produce exactly 1 response"
    assert [(a[1], one_only in a[3]) for a in answers[17:19]] == [(400, True), (400, True)]  # 0 and 2 responses
    assert orjson.loads(answers[19][3])["I"] == 0


def test_generate_stream_sends_one_event_per_response(server):
    conn = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=30)
    try:
        conn.request("POST", "/v2/models/repeat/generate_stream", body=orjson.dumps({"N": 3}))
        resp = conn.getresponse()
        assert resp.status == 200 and resp.getheader("content-type") == "text/event-stream; charset=utf-8"
        events = [orjson.loads(line[len(b"data: "):]) for line in resp.read().split(b"\n\n") if line]
    finally:
        conn.close()
    assert [e["I"] for e in events] == [0, 1, 2]
    conn = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=30)
    try:
        conn.request("POST", "/v2/models/repeat/generate_stream", body=orjson.dumps({"N": -1}))
        events = [orjson.loads(line[len(b"data: "):]) for line in conn.getresponse().read().split(b"\n\n") if line]
    finally:
        conn.close()
    assert events == [{"model_name": "repeat", "model_version": "1", "I": 0},
                      {"error": "negative counts are refused"},
                      {"model_name": "repeat", "model_version": "1", "I": 1}]
