"""The HTTP infer route's two paths answer alike. A small body with a declared length is served
straight from the protocol (http_protocol.FastInfer); the same request sent chunked takes the ASGI
app. Both give the same status, headers and body for successes and for every kind of error.
Pipelined requests are answered in order across the two paths, `Expect: 100-continue` is answered
before the body comes, HTTP/1.0 clients are answered and closed, an idle keep-alive connection
closes after the keep-alive timeout (but not while its request is running), and a client that sends
without reading its answers is held to a bounded buffer."""

import gzip
import socket
import time

import numpy as np
import orjson
import pytest
from test_hostile import _rss_mib

from conftest import http_request

ADD = {"inputs": [{"name": "A", "datatype": "FP32", "shape": [1, 3], "data": [1, 2, 3]},
                  {"name": "B", "datatype": "FP32", "shape": [1, 3], "data": [1, 1, 1]}]}


def _binary_request() -> tuple[bytes, dict]:
    """A JSON header and two binary inputs, asking for a binary output."""
    a = np.array([[1, 2, 3]], np.float32).tobytes()
    doc = {"inputs": [{"name": "A", "datatype": "FP32", "shape": [1, 3], "parameters": {"binary_data_size": 12}},
                      {"name": "B", "datatype": "FP32", "shape": [1, 3], "parameters": {"binary_data_size": 12}}],
           "outputs": [{"name": "C", "parameters": {"binary_data": True}}]}
    head = orjson.dumps(doc)
    return head + a + a, {"Inference-Header-Content-Length": str(len(head))}


def _read_response(sock: socket.socket, buf: bytes = b"") -> tuple[int, dict, bytes, bytes]:
    """One response (status, headers, body) from a connection, and what followed it."""
    while b"\r\n\r\n" not in buf:
        chunk = sock.recv(65536)
        assert chunk, f"connection closed before a response: {buf!r}"
        buf += chunk
    head, buf = buf.split(b"\r\n\r\n", 1)
    lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.lower().split(": ", 1) for line in lines[1:])
    length = int(headers["content-length"])
    while len(buf) < length:
        chunk = sock.recv(65536)
        assert chunk, "connection closed within a body"
        buf += chunk
    return int(lines[0].split()[1]), headers, buf[:length], buf[length:]


def _request(path: str, body: bytes, headers: dict, chunked: bool, version: str = "1.1") -> bytes:
    head = f"POST {path} HTTP/{version}\r\nHost: x\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    if chunked:
        chunk = b"%x\r\n%s\r\n" % (len(body), body) if body else b""
        return (head + "Transfer-Encoding: chunked\r\n\r\n").encode() + chunk + b"0\r\n\r\n"
    return (head + f"Content-Length: {len(body)}\r\n\r\n").encode() + body


def _exchange(port: int, raw: bytes) -> tuple[int, dict, bytes]:
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(raw)
        status, headers, body, _ = _read_response(s)
    headers.pop("date", None)
    return status, headers, body


CASES = {
    "json": ("/v2/models/add_py/infer", orjson.dumps(ADD), {}),
    "versioned": ("/v2/models/add_py/versions/1/infer", orjson.dumps(ADD), {}),
    "binary": ("/v2/models/add_py/infer", *_binary_request()),
    "gzip response": ("/v2/models/add_py/infer", orjson.dumps(ADD), {"Accept-Encoding": "gzip"}),
    "malformed json": ("/v2/models/add_py/infer", b'{"inputs": [', {}),
    "unknown model": ("/v2/models/nope/infer", orjson.dumps(ADD), {}),
    "unknown version": ("/v2/models/add_py/versions/7/infer", orjson.dumps(ADD), {}),
    "wrong shape": ("/v2/models/add_py/infer", orjson.dumps(
        {"inputs": [dict(ADD["inputs"][0], shape=[1, 4]), ADD["inputs"][1]]}), {}),
    "bad header length": ("/v2/models/add_py/infer", orjson.dumps(ADD), {"Inference-Header-Content-Length": "x"}),
    "model raises": ("/v2/models/fail/infer", orjson.dumps(
        {"inputs": [{"name": "X", "datatype": "FP32", "shape": [1], "data": [1]}]}), {}),
    "decoupled": ("/v2/models/repeat/infer", orjson.dumps(
        {"inputs": [{"name": "N", "datatype": "INT32", "shape": [1], "data": [2]}]}), {}),
    "empty body": ("/v2/models/add_py/infer", b"", {}),
}


@pytest.mark.parametrize("case", CASES)
def test_both_paths_answer_alike(server, case):
    path, body, headers = CASES[case]
    fast = _exchange(server.http_port, _request(path, body, headers, chunked=False))
    asgi = _exchange(server.http_port, _request(path, body, headers, chunked=True))
    assert fast == asgi
    status, answer_headers, answer = fast
    if case in ("json", "versioned", "binary", "gzip response"):
        assert status == 200
        if case == "gzip response":
            assert answer_headers["content-encoding"] == "gzip"
            answer = gzip.decompress(answer)
        if case == "binary":
            split = int(answer_headers["inference-header-content-length"])
            assert np.frombuffer(answer[split:], np.float32).tolist() == [2, 4, 6]
        else:
            assert orjson.loads(answer)["outputs"][0]["data"] == [2, 3, 4]
    else:
        assert status >= 400 and orjson.loads(answer)["error"]


def test_pipelined_requests_are_answered_in_order(server):
    """Requests sent back to back on one connection: the first is served from the protocol, the
    ones that arrive while it runs queue behind it, whatever their path."""
    add = orjson.dumps(ADD)
    other = orjson.dumps({"inputs": [ADD["inputs"][0], dict(ADD["inputs"][1], data=[5, 5, 5])]})
    raw = (_request("/v2/models/add_py/infer", add, {}, chunked=False)
           + _request("/v2/models/add_py/infer", other, {}, chunked=False)
           + b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\n\r\n"
           + _request("/v2/models/nope/infer", add, {}, chunked=False)
           + _request("/v2/models/add_py/infer", other, {}, chunked=True)
           + _request("/v2/models/add_py/infer", add, {}, chunked=False))
    with socket.create_connection(("127.0.0.1", server.http_port), timeout=30) as s:
        s.sendall(raw)
        rest, answers = b"", []
        for _ in range(6):
            status, _, body, rest = _read_response(s, rest)
            answers.append((status, orjson.loads(body)["outputs"][0]["data"] if status == 200 and body else body))
    assert answers[0] == (200, [2, 3, 4]) and answers[1] == (200, [6, 7, 8]) and answers[2] == (200, b"")
    assert answers[3][0] == 404  # the unknown model
    assert answers[4] == (200, [6, 7, 8]) and answers[5] == (200, [2, 3, 4])


def test_expect_100_continue_is_answered_before_the_body(server):
    """A client that asks to be told to go on (curl does, for large bodies) gets 100 Continue
    before it sends its body, then its answer, on the same connection as a plain request after it."""
    body = orjson.dumps(ADD)
    head = _request("/v2/models/add_py/infer", body, {"Expect": "100-continue"}, chunked=False)[:-len(body)]
    with socket.create_connection(("127.0.0.1", server.http_port), timeout=30) as s:
        s.sendall(head)
        interim = b""
        while b"\r\n\r\n" not in interim:
            chunk = s.recv(65536)
            assert chunk, f"connection closed before 100 Continue: {interim!r}"
            interim += chunk
        assert interim.startswith(b"HTTP/1.1 100 Continue\r\n"), interim
        s.sendall(body)
        status, _, answer, rest = _read_response(s, interim.split(b"\r\n\r\n", 1)[1])
        assert status == 200 and orjson.loads(answer)["outputs"][0]["data"] == [2, 3, 4]
        s.sendall(_request("/v2/models/add_py/infer", body, {}, chunked=False))
        status, _, answer, _ = _read_response(s, rest)
        assert status == 200 and orjson.loads(answer)["outputs"][0]["data"] == [2, 3, 4]


def test_http10_clients_are_answered_and_closed(server):
    with socket.create_connection(("127.0.0.1", server.http_port), timeout=30) as s:
        s.sendall(_request("/v2/models/add_py/infer", orjson.dumps(ADD), {}, chunked=False, version="1.0"))
        status, headers, body, _ = _read_response(s)
        assert (status, headers["connection"]) == (200, "close")
        assert orjson.loads(body)["outputs"][0]["data"] == [2, 3, 4]
        assert s.recv(1) == b""  # closed after the response


def _seconds_until_closed(sock: socket.socket, limit: float) -> float:
    started = time.monotonic()
    sock.settimeout(limit)
    try:
        assert sock.recv(1) == b""
    except ConnectionResetError:
        pass
    return time.monotonic() - started


def test_idle_keep_alive_connections_close_after_the_timeout(start_server, tmp_path):
    from test_queue_policy import _repo

    server = start_server([_repo(tmp_path, "")], "--http-keepalive-timeout-secs=1")
    x = {"inputs": [{"name": "X", "datatype": "FP32", "shape": [1, 1], "data": [1.5]}]}  # runs 1.5 s
    with socket.create_connection(("127.0.0.1", server.http_port), timeout=30) as s:
        s.sendall(_request("/v2/models/sleepy/infer", orjson.dumps(x), {}, chunked=False))
        started = time.monotonic()
        status, _, _, _ = _read_response(s)  # a request running past the timeout is answered
        assert status == 200 and time.monotonic() - started >= 1.4
        s.sendall(_request("/v2/models/sleepy/infer", orjson.dumps(dict(x, inputs=[dict(
            x["inputs"][0], data=[0.0])])), {}, chunked=False))
        assert _read_response(s)[0] == 200  # and the connection serves on
        assert 0.5 < _seconds_until_closed(s, 10) < 5
    assert http_request(server.http_port, "GET", "/v2/health/ready")[0] == 200


def test_a_client_that_sends_without_reading_is_held_to_a_bounded_buffer(server):
    """Requests sent back to back by a client that never reads its answers: the server stops
    reading from it once its answers back up, instead of buffering them without end, and serves
    others meanwhile."""
    one = _request("/v2/models/add_py/infer", orjson.dumps(ADD), {}, chunked=False)
    before = _rss_mib(server.pid)
    with socket.create_connection(("127.0.0.1", server.http_port), timeout=30) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.setblocking(False)
        sent, pending, stalled_since = 0, memoryview(one), None
        while stalled_since is None or time.monotonic() - stalled_since < 1.0:
            try:
                pending = pending[s.send(pending):]
                if not pending:
                    sent, pending = sent + 1, memoryview(one)
                stalled_since = None
            except BlockingIOError:  # the server has stopped reading from us
                stalled_since = stalled_since or time.monotonic()
                assert http_request(server.http_port, "GET", "/v2/health/ready")[0] == 200
            assert sent < 200_000, "the server kept reading a client that never reads"
        assert _rss_mib(server.pid) - before < 64
        assert http_request(server.http_port, "POST", "/v2/models/add_py/infer", orjson.dumps(ADD))[0] == 200


def test_fast_path_response_heads_follow_the_date(server):
    """The fast path keeps a JSON response's head for reuse: its Date header still moves on. No
    response names the server's software (Triton's name none either)."""
    def answer():
        status, headers, body = server.post("/v2/models/add_py/infer", orjson.dumps(ADD))
        assert status == 200 and headers["content-type"] == "application/json", body
        assert int(headers["content-length"]) == len(body)
        assert "server" not in headers
        return headers["date"]

    assert "server" not in server.get("/v2/health/ready")[1]

    first = answer()
    server.wait_until(lambda: answer() != first, 10, "a later answer's Date header to move on")
