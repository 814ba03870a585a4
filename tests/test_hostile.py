"""Hostile and careless clients: decompression bombs, huge declared sizes and oversized messages are
refused before the server allocates them, without stalling other clients; the frontend's memory
stays bounded afterwards."""

import gzip
import http.client
import socket
import threading
import time

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.grpc import service_pb2 as pb

import procfs
from conftest import add_inputs, http_request
from hostile_clients import h2frame

SERVICE = "/inference.GRPCInferenceService/"


def _rss_mib(pid: int) -> float:
    return procfs.rss_bytes(pid) / (1 << 20)


class HealthProbe:
    """Calls /v2/health/live in a loop from a thread of its own, keeping the slowest answer."""

    def __init__(self, port: int):
        self.port, self.slowest, self.calls, self.stop = port, 0.0, 0, threading.Event()
        self.failure: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        try:
            while not self.stop.is_set():
                started = time.perf_counter()
                status = http_request(self.port, "GET", "/v2/health/live")[0]
                assert status == 200, f"/v2/health/live answered {status}"
                self.slowest = max(self.slowest, time.perf_counter() - started)
                self.calls += 1
        except BaseException as e:  # raised again in the test's own thread, by __exit__
            self.failure = e

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join(30)
        assert not self.thread.is_alive(), "the health probe hung"
        if self.failure is not None:
            raise AssertionError(f"a health call failed while the test ran: {self.failure!r}") from self.failure


@pytest.fixture(scope="module")
def bomb():
    """256 MiB of zeros, gzipped to a few hundred KiB."""
    return gzip.compress(bytes(256 << 20), compresslevel=9)


def test_http_decompression_bomb_is_refused_at_the_limit_without_stalling_others(server, bomb):
    rss_before = _rss_mib(server.pid)
    with HealthProbe(server.http_port) as probe:
        for _ in range(3):
            status, _, raw = http_request(server.http_port, "POST", "/v2/models/add_py/infer", bomb,
                                          {"Content-Encoding": "gzip", "Content-Type": "application/json"})
            assert status == 413, raw
            assert b"The decompressed request body" in raw and b"--http-max-input-size" in raw
    print(f"slowest health call while bombs were refused: {probe.slowest * 1000:.1f} ms over {probe.calls} calls")
    assert probe.calls > 0 and probe.slowest < 1.0  # a bomb never holds the event loop (was 19 s)
    assert _rss_mib(server.pid) - rss_before < 300  # at most the limit was ever inflated
    a = np.ones((1, 3), np.float32)
    assert grpcclient.InferenceServerClient(server.grpc_url).infer("add", add_inputs(grpcclient, a)) is not None


def _content_length(reply: bytes) -> int:
    for line in reply.split(b"\r\n\r\n", 1)[0].split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            return int(line.split(b":", 1)[1])
    return 0


def test_a_declared_body_over_the_limit_is_refused_before_it_is_sent(server):
    with socket.create_connection(("127.0.0.1", server.http_port), timeout=10) as s:
        s.sendall(b"POST /v2/models/add_py/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: 99999999999\r\n\r\n")
        reply = b""  # answered at once: the server does not wait for 93 GiB
        while b"\r\n\r\n" not in reply or len(reply.split(b"\r\n\r\n", 1)[1]) < _content_length(reply):
            chunk = s.recv(65536)
            assert chunk, reply
            reply += chunk
    assert reply.startswith(b"HTTP/1.1 413"), reply
    assert b"99999999999 bytes exceeds the maximum allowed value" in reply


def test_a_body_framed_two_ways_is_refused_and_the_connection_closed(server):
    """Content-Length beside Transfer-Encoding: chunked is how requests are smuggled past a proxy that
    reads the other framing: refused (400) and the connection closed, not read either way (Triton
    accepts it; README)."""
    with socket.create_connection(("127.0.0.1", server.http_port), timeout=10) as s:
        s.sendall(b"POST /v2/models/add_py/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n"
                  b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\nGET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")
        reply = b""
        while chunk := s.recv(65536):
            reply += chunk
    assert reply.startswith(b"HTTP/1.1 400") and reply.count(b"HTTP/1.1") == 1, reply  # nothing smuggled through
    assert http_request(server.http_port, "GET", "/v2/health/live")[0] == 200


def test_a_client_that_sends_its_whole_body_before_reading_gets_the_413(start_server, example_repo):
    """With `Connection: close` (as urllib sends), the connection is shut for writing after the 413
    and the rest of the body is read and dropped, so the client reads the answer instead of a reset;
    a client that does not send the rest is closed LINGER_SECONDS later."""
    import urllib.error
    import urllib.request

    from tritonmp.frontends.http_protocol import LINGER_SECONDS

    server = start_server([example_repo], "--http-max-input-size=65536")
    body = b"x" * (4 << 20)  # far more than the socket buffers hold
    for _ in range(3):
        request = urllib.request.Request(f"http://{server.url}/v2/models/add_py/infer", data=body, method="POST")
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(request, timeout=30)
        assert e.value.code == 413 and b"exceeds the maximum allowed value of 65536" in e.value.read()
    with socket.create_connection(("127.0.0.1", server.http_port), timeout=30) as s:
        s.sendall(b"POST /v2/models/add_py/infer HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                  b"Content-Length: 99999999\r\n\r\n" + b"x" * 1000)
        started = time.monotonic()
        reply = b""
        while chunk := s.recv(65536):  # the answer, then the end of the server's side
            reply += chunk
        assert reply.startswith(b"HTTP/1.1 413")
        # the rest never comes: the server stops waiting for it
        server.wait_until(lambda: "that was still sending a body" in server.log(), timeout=LINGER_SECONDS + 10,
                          what="the lingering close to end")
        assert LINGER_SECONDS - 0.5 < time.monotonic() - started < LINGER_SECONDS + 5
    assert server.get("/v2/health/ready")[0] == 200


def test_bodies_over_a_small_limit_are_refused_as_received_and_as_inflated(start_server, example_repo):
    server = start_server([example_repo], "--http-max-input-size=65536")
    big = b'{"inputs": [' + b" " * 70000 + b"]}"
    status, _, raw = server.post("/v2/models/add_py/infer", big)
    assert status == 413 and b"Request body of 70014 bytes" in raw  # its Content-Length, before it is read
    conn = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=30)
    try:  # chunked, so no length is declared: refused as it arrives
        conn.request("POST", "/v2/models/add_py/infer", body=iter([big[:40000], big[40000:]]), encode_chunked=True)
        response = conn.getresponse()
        assert response.status == 413 and b"exceeds the maximum allowed value of 65536" in response.read()
    finally:
        conn.close()
    status, _, raw = server.post("/v2/models/add_py/infer", gzip.compress(big),
                                 {"Content-Encoding": "gzip"})
    assert status == 413 and b"The decompressed request body" in raw
    status, _, raw = server.post("/v2/repository/index", big)  # every endpoint, not only infer
    assert status == 413
    status, _, raw = server.post("/v2/models/add_py/infer", gzip.compress(b"{}")[:-8], {"Content-Encoding": "gzip"})
    assert status == 400 and b"failed to decompress" in raw  # a truncated stream, not a crash
    assert server.get("/v2/health/ready")[0] == 200


def _infer_message(nbytes: int) -> bytes:
    request = pb.ModelInferRequest(model_name="add")
    request.inputs.add(name="A", datatype="FP32", shape=[1, 3])
    request.inputs.add(name="B", datatype="FP32", shape=[1, 3])
    request.raw_input_contents.extend([bytes(nbytes), bytes(12)])
    return request.SerializeToString()


@pytest.mark.parametrize("engine", ["builtin", "grpcio"])
def test_grpc_messages_over_the_limit_as_sent_and_as_inflated(start_server, example_repo, engine):
    server = start_server([example_repo], "--grpc-max-input-size=1048576", "--grpc-engine", engine)
    with grpc.insecure_channel(server.grpc_url) as channel:
        call = channel.unary_unary(SERVICE + "ModelInfer")
        with pytest.raises(grpc.RpcError) as e:
            call(_infer_message(2 << 20), timeout=30)  # 2 MiB on the wire
        assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "larger than max" in e.value.details()
        with pytest.raises(grpc.RpcError) as e:  # 64 MiB once inflated, a few KiB on the wire
            call(_infer_message(64 << 20), timeout=60, compression=grpc.Compression.Gzip)
        assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert channel.unary_unary(SERVICE + "ServerLive")(b"", timeout=10) == b"\x08\x01"  # the server serves on
    a = np.ones((1, 3), np.float32)
    np.testing.assert_array_equal(
        grpcclient.InferenceServerClient(server.grpc_url).infer("add", add_inputs(grpcclient, a)).as_numpy("C"), 2 * a)


def _closed_within(sock: socket.socket, seconds: float, trickle: bytes = b"") -> float:
    """Seconds until the server closes `sock` (sending `trickle` every 0.2 s meanwhile); fails after `seconds`."""
    started = time.monotonic()
    sock.settimeout(0.2)
    while time.monotonic() - started < seconds:
        try:
            if trickle:
                sock.sendall(trickle)
            if sock.recv(65536) == b"":
                return time.monotonic() - started
        except TimeoutError:
            continue
        except (ConnectionResetError, BrokenPipeError):
            return time.monotonic() - started
    raise AssertionError(f"the server kept the connection open for {seconds} s")


def _http_responses(sock: socket.socket, n: int) -> list[tuple[int, bytes]]:
    """The next `n` responses (status, body) on a keep-alive connection; bodies have a Content-Length."""
    buf, out = b"", []
    while len(out) < n:
        chunk = sock.recv(1 << 20)
        assert chunk, f"connection closed after {out}"
        buf += chunk
        while (end := buf.find(b"\r\n\r\n")) >= 0:
            head = buf[:end].decode("latin-1").lower()
            length = int(head.split("content-length:")[1].split("\r\n")[0])
            if len(buf) < end + 4 + length:
                break
            out.append((int(head.split()[1]), buf[end + 4:end + 4 + length]))
            buf = buf[end + 4 + length:]
    return out


def test_large_http_bodies_compressed_pipelined_or_cut_short(server):
    """Bodies of 64 KiB and more are received into one buffer of their declared length: gzip
    bodies, a large body followed at once by more requests on the same connection, and a body cut
    short by a client that goes away all behave as small bodies do."""
    from test_datatypes import TYPES

    big = np.arange(1 << 18, dtype=np.float32)  # 1 MiB
    client = httpclient.InferenceServerClient(server.url)
    inputs = []
    for dt, value in dict(TYPES, FP32=big).items():
        inputs.append(httpclient.InferInput(f"IN_{dt}", list(value.shape), dt))
        inputs[-1].set_data_from_numpy(value)
    for compression in (None, "gzip", None):
        result = client.infer("identity", inputs, request_compression_algorithm=compression)
        np.testing.assert_array_equal(result.as_numpy("OUT_FP32"), big)
    add = (b'{"inputs": [{"name": "A", "datatype": "FP32", "shape": [1, 3], "data": [1, 2, 3]}, '
           b'{"name": "B", "datatype": "FP32", "shape": [1, 3], "data": [1, 1, 1]}]}')
    padded = add + b" " * 100_000  # JSON whitespace: a large body
    request = b"POST /v2/models/add_py/infer HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n"
    with socket.create_connection(("127.0.0.1", server.http_port), timeout=30) as s:
        s.sendall(request % len(padded) + padded + request % len(add) + add
                  + b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\n\r\n")
        (s1, b1), (s2, b2), (s3, _) = _http_responses(s, 3)
    assert (s1, s2, s3) == (200, 200, 200)
    assert b'"data":[2.0,3.0,4.0]' in b1 and b'"data":[2.0,3.0,4.0]' in b2
    with socket.create_connection(("127.0.0.1", server.http_port), timeout=30) as s:
        s.sendall(request % (1 << 20) + b" " * 200_000)  # then the client goes
    result = client.infer("identity", inputs)
    np.testing.assert_array_equal(result.as_numpy("OUT_FP32"), big)


@pytest.fixture
def strict_server(start_server, example_repo):
    return start_server([example_repo], "--http-header-timeout-secs=1", "--http-body-timeout-secs=1",
                        "--max-connections=40")


def test_slow_headers_stalled_bodies_and_silent_connections_are_closed(strict_server):
    server = strict_server
    port = server.http_port
    silent = socket.create_connection(("127.0.0.1", port))
    trickling = socket.create_connection(("127.0.0.1", port))
    trickling.sendall(b"POST /v2/models/add_py/infer HTTP/1.1\r\nHost: x\r\n")
    stalled = socket.create_connection(("127.0.0.1", port))
    stalled.sendall(b"POST /v2/models/add_py/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"inp")
    stalled_large = socket.create_connection(("127.0.0.1", port))  # a body received into a buffer of its length
    stalled_large.sendall(b"POST /v2/models/add_py/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 1048576\r\n\r\n"
                          + b" " * 100_000)
    grpc_silent = socket.create_connection(("127.0.0.1", server.grpc_port))
    try:
        a = np.ones((1, 3), np.float32)
        client = grpcclient.InferenceServerClient(server.grpc_url)
        assert client.infer("add", add_inputs(grpcclient, a)) is not None  # others are served meanwhile
        assert _closed_within(trickling, 10, b"X-Slow: 1\r\n") < 5  # trickling headers does not extend it
        for sock in (silent, stalled, stalled_large, grpc_silent):
            assert _closed_within(sock, 10) < 5
    finally:
        for sock in (silent, trickling, stalled, stalled_large, grpc_silent):
            sock.close()
    assert server.get("/v2/health/ready")[0] == 200


def test_a_body_that_keeps_coming_is_served_and_a_kept_alive_connection_trickling_headers_is_not(strict_server):
    """The body deadline is per piece: a body sent in pieces, each within the deadline, is served
    however long it takes in all. A keep-alive connection's next request gets a header deadline of its
    own, from its first bytes, which trickling does not extend."""
    body = b'{"inputs":[{"name":"A","shape":[1,3],"datatype":"FP32","data":[1,2,3]},' \
           b'{"name":"B","shape":[1,3],"datatype":"FP32","data":[1,1,1]}]}'
    head = b"POST /v2/models/add_py/infer HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(body)
    with socket.create_connection(("127.0.0.1", strict_server.http_port), timeout=30) as s:
        s.sendall(head)
        pieces = [body[i:i + 16] for i in range(0, len(body), 16)]
        started = time.monotonic()
        for piece in pieces:  # 2.4 s in all, a piece every 0.3 s: past the 1 s deadline, never between pieces
            time.sleep(2.4 / len(pieces))
            s.sendall(piece)
        assert time.monotonic() - started > 2
        ((status, answer),) = _http_responses(s, 1)
        assert status == 200 and b'"data":[2.0,3.0,4.0]' in answer
        s.sendall(head + body)  # kept alive: served again
        assert _http_responses(s, 1)[0][0] == 200
        s.sendall(b"POST /v2/models/add_py/infer HTTP/1.1\r\n")
        assert _closed_within(s, 10, b"X-Slow: 1\r\n") < 5


def test_connections_past_the_cap_are_closed_at_once_and_the_server_recovers(strict_server):
    server = strict_server
    socks = []
    try:
        for _ in range(60):
            socks.append(socket.create_connection(("127.0.0.1", server.http_port)))
        closed = 0
        for sock in socks:
            sock.settimeout(0.5)
            try:
                if sock.recv(1) == b"":
                    closed += 1
            except TimeoutError:
                pass
            except ConnectionResetError:
                closed += 1
        assert closed >= 20  # the ones past the 40 allowed
    finally:
        for sock in socks:
            sock.close()
    # the idle ones go after the header deadline; real clients are served again
    server.wait_until(lambda: server.get("/v2/health/ready")[0] == 200, timeout=30, what="service after the flood")


@pytest.mark.parametrize("model", ["add", "add_py"])
def test_a_region_shrunk_or_unlinked_by_its_client_fails_the_request_not_the_worker(start_server, example_repo,
                                                                                    model, request):
    import os

    import tritonclient.http as httpclient
    import tritonclient.utils.shared_memory as shm

    server = start_server([example_repo], "--allow-client-shm=true")
    client = httpclient.InferenceServerClient(server.url)
    a = np.arange(3, dtype=np.float32).reshape(1, 3)
    key = f"/hostile-{model}-{request.node.name[-8:]}"
    handle = shm.create_shared_memory_region("victim", key, 4096)
    try:
        shm.set_shared_memory_region(handle, [a])
        client.register_system_shared_memory("victim", key, 4096)
        inputs = add_inputs(httpclient, a)
        inputs[0].set_shared_memory("victim", a.nbytes)
        out = httpclient.InferRequestedOutput("C")
        out.set_shared_memory("victim", a.nbytes, offset=2048)
        client.infer(model, inputs, outputs=[out])
        np.testing.assert_array_equal(shm.get_contents_as_numpy(handle, np.float32, [1, 3], offset=2048), 2 * a)
        workers_before = server.log().count("is ready (pid")
        with open(f"/dev/shm{key}", "r+b") as f:  # the client shrinks the segment under the server
            os.ftruncate(f.fileno(), 8)
        for _ in range(2):
            with pytest.raises(Exception) as e:
                client.infer(model, inputs, outputs=[out])
            assert "its client shrank it after registering it" in str(e.value)
        os.unlink(f"/dev/shm{key}")  # and then removes it: the server's mapping keeps it valid
        np.testing.assert_array_equal(client.infer(model, add_inputs(httpclient, a)).as_numpy("C"), 2 * a)
        assert server.log().count("is ready (pid") == workers_before  # no worker died
        assert "was killed" not in server.log()
    finally:
        client.unregister_system_shared_memory()
        try:
            shm.destroy_shared_memory_region(handle)
        except Exception:
            pass  # unlinked by the test already


PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"


def _call_headers(path: str = SERVICE + "ServerLive") -> bytes:
    import hpack

    return hpack.Encoder().encode([(":method", "POST"), (":scheme", "http"), (":path", path),
                                   (":authority", "x"), ("content-type", "application/grpc"), ("te", "trailers")])


def _drain(sock: socket.socket, seen: list) -> None:
    """Read what the server sends until the connection ends (the test shuts it down)."""
    while True:
        try:
            data = sock.recv(1 << 20)
        except OSError:
            return
        if not data:
            return
        seen.append(len(data))


def _serves(server) -> bool:
    a = np.ones((1, 3), np.float32)
    client = grpcclient.InferenceServerClient(server.grpc_url)
    return client.infer("add", add_inputs(grpcclient, a)).as_numpy("C").tolist() == [[2.0, 2.0, 2.0]]


def _goaway_code(data: bytes) -> int | None:
    """The error code of the first GOAWAY frame among the frames in `data`."""
    pos = 0
    while pos + 9 <= len(data):
        length = int.from_bytes(data[pos:pos + 3], "big")
        if data[pos + 3] == 7 and pos + 17 <= len(data):
            return int.from_bytes(data[pos + 13:pos + 17], "big")
        pos += 9 + length
    return None


def _until_closed(sock: socket.socket, seconds: float) -> bytes | None:
    """What the server sends until it closes the connection; None if it is still open after `seconds`."""
    sock.settimeout(seconds)
    data = b""
    try:
        while chunk := sock.recv(1 << 20):
            data += chunk
    except ConnectionResetError:
        pass
    except TimeoutError:
        return None
    return data


def test_http2_rapid_reset_continuation_and_stream_limits(server):
    rss_before = _rss_mib(server.pid)
    headers = _call_headers()
    # rapid reset: streams opened and reset at once, until the server has had enough
    with socket.create_connection(("127.0.0.1", server.grpc_port)) as s:
        s.sendall(PREFACE + h2frame(4, 0, 0))
        try:
            for i in range(0, 60000, 500):
                s.sendall(b"".join(h2frame(1, 4, sid, headers) + h2frame(3, 0, sid, (8).to_bytes(4, "big"))
                                   for sid in range(2 * i + 1, 2 * i + 1000, 2)))
        except (BrokenPipeError, ConnectionResetError):
            pass
        data = _until_closed(s, 10)
        assert data is not None and _goaway_code(data) == 0xB  # GOAWAY ENHANCE_YOUR_CALM
        assert _serves(server)  # others are served
    # past the advertised stream limit, new streams are refused with REFUSED_STREAM
    with socket.create_connection(("127.0.0.1", server.grpc_port), timeout=30) as s:
        s.sendall(PREFACE + h2frame(4, 0, 0) + b"".join(h2frame(1, 4, 2 * i + 1, headers) for i in range(1100)))
        data = b""
        deadline = time.monotonic() + 20
        while data.count(b"\x00\x00\x04\x03") < 76 and time.monotonic() < deadline:  # RST_STREAM frames
            data += s.recv(1 << 20)
        assert data.count(b"\x00\x00\x04\x03") >= 76 and b"\x00\x00\x00\x07" in data  # REFUSED_STREAM
    # a header block that never ends: CONTINUATION after CONTINUATION, until past the header list limit
    with socket.create_connection(("127.0.0.1", server.grpc_port), timeout=30) as s:
        s.sendall(PREFACE + h2frame(4, 0, 0) + h2frame(1, 0, 1, headers))
        junk = h2frame(9, 0, 1, b"\x40\x01x\x7f\x81" + b"y" * 16000)  # literal headers, over and over
        try:
            for _ in range(400):
                s.sendall(junk)
        except (BrokenPipeError, ConnectionResetError):
            pass
        data = _until_closed(s, 10)
        assert data is not None and _goaway_code(data) == 0xB
    assert _serves(server)
    assert _rss_mib(server.pid) - rss_before < 200


def test_http2_ping_and_settings_floods_from_a_client_that_never_reads(server):
    rss_before = _rss_mib(server.pid)
    with socket.create_connection(("127.0.0.1", server.grpc_port), timeout=2) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        # a call stays open, so gRPC's ping policy allows any number of PINGs: only backpressure is left
        s.sendall(PREFACE + h2frame(4, 0, 0) + h2frame(1, 4, 1, _call_headers(SERVICE + "ModelStreamInfer")))
        flood = (h2frame(6, 0, 0, b"12345678") + h2frame(4, 0, 0)) * 2000
        sent = 0
        try:
            for _ in range(1000):  # up to 2,000,000 frames that each want an answer
                s.sendall(flood)
                sent += 1
        except (TimeoutError, BrokenPipeError, ConnectionResetError):
            pass
        assert sent < 1000  # the server stopped reading from a client that does not read: TCP pushed back
        assert _serves(server)
    assert _rss_mib(server.pid) - rss_before < 100


def test_a_large_json_body_is_decoded_without_stalling_others(server):
    """30 MiB of JSON numbers (8 million Python objects to parse) are decoded in a helper process:
    on the event loop they held every other client for about a second."""
    body = (b'{"inputs":[{"name":"A","shape":[1,3],"datatype":"FP32","data":[' + b"1.5," * 8_000_000
            + b'1]},{"name":"B","shape":[1,3],"datatype":"FP32","data":[1,2,3]}]}')
    with HealthProbe(server.http_port) as probe:
        for _ in range(2):
            status, _, raw = http_request(server.http_port, "POST", "/v2/models/add_py/infer", body, timeout=120)
            assert status == 400 and b"Shape does not match true shape of 'data' field" in raw  # its errors still come
    print(f"slowest health call while 30 MiB of JSON was decoded: {probe.slowest * 1000:.1f} ms")
    assert probe.calls > 0 and probe.slowest < 0.5
    a = np.ones((1, 3), np.float32)
    doc = {"inputs": [{"name": n, "shape": [1, 3], "datatype": "FP32", "data": [1.0] * 3} for n in "AB"],
           "parameters": {"pad": "x" * (2 << 20)}}  # over the offload size, and well formed: served
    import json

    status, _, raw = http_request(server.http_port, "POST", "/v2/models/add_py/infer", json.dumps(doc).encode())
    assert status == 200 and json.loads(raw)["outputs"][0]["data"] == (a + a).ravel().tolist()


def _raw_http(port: int, request: bytes) -> bytes:
    """Send `request` and read the answer until the server closes the connection."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(request)
        data = b""
        while chunk := s.recv(1 << 16):
            data += chunk
        return data


def test_request_heads_over_the_limits_are_refused_and_those_within_are_served(server):
    from tritonmp.frontends.http_protocol import MAX_HEAD, MAX_LINE

    port = server.http_port
    assert http_request(port, "GET", "/v2/health/ready", headers={"X-Big": "a" * (MAX_LINE - 100)})[0] == 200
    answer = _raw_http(port, b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\nX-Big: %s\r\n\r\n" % (b"a" * MAX_LINE))
    assert answer.startswith(b"HTTP/1.1 431 ") and b"the request's header 'X-Big' is longer than" in answer
    answer = _raw_http(port, b"GET /v2/health/ready?%s HTTP/1.1\r\nHost: x\r\n\r\n" % (b"a" * MAX_LINE))
    assert answer.startswith(b"HTTP/1.1 414 ")
    many = b"".join(b"X-H%d: %s\r\n" % (i, b"a" * 1000) for i in range(MAX_HEAD // 1000 + 1))
    answer = _raw_http(port, b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\n%s\r\n" % many)
    assert answer.startswith(b"HTTP/1.1 431 ") and b"the request's head is larger than" in answer
    # gRPC: metadata past the soft limit fails that call, and the connection serves on
    from tritonmp.frontends.http2 import HEADER_LIST_SOFT

    from hostile_clients import END_HEADERS, END_STREAM, HEADERS, Conn, call_block, h2frame, literal

    conn = Conn(server.grpc_port)
    try:
        for sid, size in ((1, HEADER_LIST_SOFT - 1000), (3, HEADER_LIST_SOFT + 1000), (5, 10)):
            conn.send(h2frame(HEADERS, END_HEADERS | END_STREAM, sid, call_block() + literal(b"x-big", b"a" * size)))
        server.wait_until(lambda: len(conn.answers) == 3, 10, "three answers")
        assert conn.answers[1].startswith("8: the request's metadata of ") \
            and conn.answers[1].endswith(f"exceeds the limit of {HEADER_LIST_SOFT}")
        assert not conn.answers[0].startswith("8:") and not conn.answers[2].startswith("8:")
        assert not conn.closed.is_set()
    finally:
        conn.close()


def test_deeply_nested_json_is_a_bad_request(server):
    deep = b"[" * 100_000 + b"]" * 100_000
    for route in ("infer", "generate"):
        status, _, body = http_request(server.http_port, "POST", f"/v2/models/add_py/{route}", deep)
        assert status == 400, (route, status, body[:200])
    assert server.get("/v2/health/ready")[0] == 200


def test_partial_frames_are_dropped_at_their_deadline_with_the_memory_they_hold(start_server, example_repo):
    """200 gRPC connections each stop in the middle of a 1 MiB DATA frame, and 50 in the middle of a
    HEADERS frame: each is closed at its deadline (1 s here), the memory goes with them, and the
    server serves throughout."""
    from hostile_clients import DATA, END_HEADERS, HEADERS, Conn, call_block, h2frame

    server = start_server([example_repo], "--http-header-timeout-secs=1", "--http-body-timeout-secs=1")
    rss_before = _rss_mib(server.pid)
    payload = b"\x00" + (2 << 20).to_bytes(4, "big") + b"x" * ((1 << 20) - 5)  # a frame of 1 MiB, of a 2 MiB message
    partial_data = h2frame(HEADERS, END_HEADERS, 1, call_block("ModelInfer")) + h2frame(DATA, 0, 1, payload)[:-1]
    partial_headers = h2frame(HEADERS, END_HEADERS, 1, call_block() * 20)[:500]
    conns = [Conn(server.grpc_port) for _ in range(250)]
    started = time.monotonic()
    try:
        for i, conn in enumerate(conns):
            assert conn.send(partial_data if i < 200 else partial_headers)
        peak = _rss_mib(server.pid)
        assert _serves(server)
        for conn in conns:
            assert conn.closed.wait(max(0.1, started + 10 - time.monotonic())), "a partial frame was held too long"
        assert time.monotonic() - started < 6
        assert all(conn.goaway == 0x1 for conn in conns), [conn.goaway for conn in conns]  # PROTOCOL_ERROR
    finally:
        for conn in conns:
            conn.close()
    print(f"frontend RSS {rss_before:.0f} MiB, {peak:.0f} with 200 partial 1 MiB frames held")
    assert peak - rss_before < 300
    assert _serves(server)
