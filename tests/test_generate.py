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
    assert status == 400 and "has no value for input 'B'" in orjson.loads(raw)["error"]
    status, _, raw = http_request(server.http_port, "POST", "/v2/models/add_py/generate",
                                  orjson.dumps({"A": [1, 2, 3], "B": [1, 2, 3], "Z": 1}))
    assert status == 400 and "unknown input(s): Z" in orjson.loads(raw)["error"]
    status, _, raw = http_request(server.http_port, "POST", "/v2/models/repeat/generate", orjson.dumps({"N": 2}))
    assert status == 400 and "use generate_stream" in orjson.loads(raw)["error"]


def test_generate_stream_sends_one_event_per_response(server):
    conn = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=30)
    try:
        conn.request("POST", "/v2/models/repeat/generate_stream", body=orjson.dumps({"N": 3}))
        resp = conn.getresponse()
        assert resp.status == 200 and resp.getheader("content-type") == "text/event-stream"
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
