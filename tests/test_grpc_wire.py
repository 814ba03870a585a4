"""gRPC on the wire: tensors larger than every HTTP/2 flow-control window, compressed requests,
deadlines and cancelled calls, many calls on one connection, malformed messages and connections,
draining on SIGTERM; and the same RPCs on the grpc.aio engine (`--grpc-engine=grpcio`)."""

import asyncio
import signal
import socket
import threading

import grpc
import hpack
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as grpcaio
from tritonclient.grpc import service_pb2 as pb
from tritonclient.utils import InferenceServerException

import procfs
from conftest import X_TO_Y_CONFIG, add_inputs, scrape_metrics, serving, write_model
from hostile_clients import h2frame

ECHO = '''
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Y = X, after sleeping X[0] seconds when X holds one element."""

    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            if x.size == 1:
                time.sleep(float(x.flat[0]))
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", x)]))
        return responses
'''
ECHO_CONFIG = X_TO_Y_CONFIG.replace("dims: [ 1 ]", "dims: [ -1 ]")
SERVICE = "/inference.GRPCInferenceService/"


@pytest.fixture(scope="module")
def echo_repo(tmp_path_factory):
    repo = tmp_path_factory.mktemp("wire") / "repo"
    write_model(repo, "echo", ECHO, ECHO_CONFIG)
    return repo


@pytest.fixture(scope="module", params=["builtin", "grpcio"])
def wire_server(request, echo_repo, example_repo, tmp_path_factory):
    with serving([echo_repo, example_repo], [f"--grpc-engine={request.param}"], tmp_path_factory) as s:
        yield s


def _x(module, value: np.ndarray):
    x = module.InferInput("X", list(value.shape), "FP32")
    x.set_data_from_numpy(value)
    return [x]


def test_tensors_larger_than_the_flow_control_windows(wire_server):
    """Over 64 MiB each way, on the default message limit (Triton's: INT32_MAX bytes)."""
    client = grpcclient.InferenceServerClient(wire_server.grpc_url)
    x = np.random.default_rng(0).random((16 << 20) + 3, dtype=np.float32)
    np.testing.assert_array_equal(client.infer("echo", _x(grpcclient, x)).as_numpy("Y"), x)


def test_a_message_declared_over_the_limit_is_refused_before_its_bytes(wire_server):
    """Only the 5-byte prefix is sent, declaring 4 GiB: the answer comes without waiting for a byte more."""
    headers = hpack.Encoder().encode([(":method", "POST"), (":scheme", "http"), (":path", SERVICE + "ModelInfer"),
                                      (":authority", "localhost"), ("content-type", "application/grpc"),
                                      ("te", "trailers")])
    with socket.create_connection(("127.0.0.1", wire_server.grpc_port), timeout=30) as s:
        s.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + h2frame(4, 0, 0) + h2frame(1, 4, 1, headers)
                  + h2frame(0, 0, 1, b"\x00\xff\xff\xff\xff"))
        frames = _read_frames(s, lambda fs: any(k == 1 and f & 1 for k, f, _ in fs))
    decoder = hpack.Decoder()
    trailers = [dict(decoder.decode(p)) for k, _, p in frames if k == 1][-1]
    assert trailers["grpc-status"] == "8", trailers
    assert "larger than max" in trailers["grpc-message"]


@pytest.mark.slow
def test_frontend_memory_does_not_grow_with_64_mib_requests(start_server, echo_repo):
    """12 ModelInfer calls of 64 MiB each way: the frontend's resident memory after them is within
    64 MiB (one tensor) of what it was after the first 5 (builtin engine); a tensor kept per call
    would add 448 MiB."""
    server = start_server([echo_repo])
    request = pb.ModelInferRequest(model_name="echo")
    request.inputs.add(name="X", datatype="FP32", shape=[16 << 20])
    request.raw_input_contents.append(np.ones(16 << 20, np.float32).tobytes())
    body = request.SerializeToString()

    def rss_mib() -> float:
        return procfs.rss_bytes(server.pid) / (1 << 20)

    with grpc.insecure_channel(server.grpc_url, options=[("grpc.max_receive_message_length", -1),
                                                         ("grpc.max_send_message_length", -1)]) as channel:
        call = channel.unary_unary(SERVICE + "ModelInfer")
        for i in range(12):
            answer = call(body, timeout=60)
            assert len(answer) > 64 << 20
            if i == 4:
                after_5 = rss_mib()
    after_12 = rss_mib()
    print(f"frontend RSS after 5 requests: {after_5:.0f} MiB, after 12: {after_12:.0f} MiB")
    assert after_12 - after_5 < 64, (after_5, after_12)


@pytest.mark.parametrize("algorithm", ["gzip", "deflate"])
def test_compressed_requests(wire_server, algorithm):
    client = grpcclient.InferenceServerClient(wire_server.grpc_url)
    a = np.arange(3000, dtype=np.float32).reshape(1000, 3)[:8]
    result = client.infer("add", add_inputs(grpcclient, a), compression_algorithm=algorithm)
    np.testing.assert_array_equal(result.as_numpy("C"), a + a)


def test_many_calls_in_flight_on_one_connection(wire_server):
    async def run():
        async with grpcaio.InferenceServerClient(wire_server.grpc_url) as client:
            values = [np.full((1, 3), i, np.float32) for i in range(200)]
            results = await asyncio.gather(*(client.infer("add", add_inputs(grpcclient, v)) for v in values))
            for v, r in zip(values, results):
                np.testing.assert_array_equal(r.as_numpy("C"), v + v)

    asyncio.run(run())


def test_client_deadline_then_the_server_serves_on(wire_server):
    client = grpcclient.InferenceServerClient(wire_server.grpc_url)
    with pytest.raises(InferenceServerException, match="Deadline Exceeded"):
        client.infer("echo", _x(grpcclient, np.array([1.0], np.float32)), client_timeout=0.2)
    got = client.infer("echo", _x(grpcclient, np.array([0.0, 5.0], np.float32))).as_numpy("Y")
    np.testing.assert_array_equal(got, [0.0, 5.0])
    assert "Traceback" not in wire_server.log()


def test_the_server_enforces_grpc_timeout(wire_server):
    """A raw call that never cancels itself: only the server can end it with DEADLINE_EXCEEDED."""
    request = pb.ModelInferRequest(model_name="echo")
    request.inputs.add(name="X", datatype="FP32", shape=[1])
    request.raw_input_contents.append(np.array([1.0], np.float32).tobytes())
    body = request.SerializeToString()
    headers = hpack.Encoder().encode([(":method", "POST"), (":scheme", "http"), (":path", SERVICE + "ModelInfer"),
                                      (":authority", "localhost"), ("content-type", "application/grpc"),
                                      ("te", "trailers"), ("grpc-timeout", "200m")])
    with socket.create_connection(("127.0.0.1", wire_server.grpc_port), timeout=30) as s:
        s.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + h2frame(4, 0, 0) + h2frame(1, 4, 1, headers)
                  + h2frame(0, 1, 1, b"\x00" + len(body).to_bytes(4, "big") + body))
        frames = _read_frames(s, lambda fs: any(k == 1 and f & 1 for k, f, _ in fs))
    decoder = hpack.Decoder()
    blocks = [dict(decoder.decode(p)) for k, _, p in frames if k == 1]  # every block, in order
    assert blocks[-1]["grpc-status"] == "4", blocks


def test_unknown_method_and_malformed_message(wire_server):
    with grpc.insecure_channel(wire_server.grpc_url) as channel:
        with pytest.raises(grpc.RpcError) as e:
            channel.unary_unary(SERVICE + "NoSuchMethod")(b"", timeout=10)
        assert e.value.code() == grpc.StatusCode.UNIMPLEMENTED
        with pytest.raises(grpc.RpcError) as e:
            channel.unary_unary(SERVICE + "ModelInfer")(b"\xff\xff\xff", timeout=10)
        assert e.value.code() == grpc.StatusCode.INTERNAL
        assert e.value.details() == "Unable to parse request"
        with pytest.raises(grpc.RpcError) as e:
            list(channel.stream_stream(SERVICE + "ModelStreamInfer")(iter([b"\xff\xff\xff"]), timeout=10))
        assert e.value.code() == grpc.StatusCode.INTERNAL
        # the connection is still good
        assert channel.unary_unary(SERVICE + "ServerLive")(b"", timeout=10) == b"\x08\x01"


def _raw_call_then_vanish(port: int) -> None:
    """Open a ModelInfer call, send half its message, and close the socket."""
    headers = hpack.Encoder().encode([(":method", "POST"), (":scheme", "http"), (":path", SERVICE + "ModelInfer"),
                                      (":authority", "localhost"), ("content-type", "application/grpc"),
                                      ("te", "trailers")])
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + h2frame(4, 0, 0) + h2frame(1, 4, 1, headers)
                  + h2frame(0, 0, 1, b"\x00\x00\x00\x10\x00" + b"\x0a\x04ec"))


def _read_frames(s: socket.socket, until) -> list[tuple[int, int, bytes]]:
    """Frames from the server until `until(frames)` holds."""
    buf, frames = b"", []
    while not until(frames):
        chunk = s.recv(65536)
        assert chunk, f"connection closed after {frames}"
        buf += chunk
        while len(buf) >= 9 and len(buf) >= 9 + int.from_bytes(buf[:3], "big"):
            n = int.from_bytes(buf[:3], "big")
            frames.append((buf[3], buf[4], buf[9:9 + n]))
            buf = buf[9 + n:]
    return frames


def test_settings_and_ping_are_acknowledged(wire_server):
    with socket.create_connection(("127.0.0.1", wire_server.grpc_port), timeout=10) as s:
        s.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + h2frame(4, 0, 0) + h2frame(6, 0, 0, b"12345678"))
        frames = _read_frames(s, lambda fs: (6, 1, b"12345678") in fs and (4, 1, b"") in fs)
        assert frames[0][0] == 4 and frames[0][1] == 0  # the server's own SETTINGS come first


def test_broken_connections_leave_the_server_serving(wire_server):
    port = wire_server.grpc_port
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")  # not HTTP/2
        s.settimeout(10)
        while s.recv(65536):  # the server ends the connection
            pass
    _raw_call_then_vanish(port)
    client = grpcclient.InferenceServerClient(wire_server.grpc_url)
    a = np.ones((1, 3), np.float32)
    np.testing.assert_array_equal(client.infer("add", add_inputs(grpcclient, a)).as_numpy("C"), a + a)


def test_stream_with_an_error_in_it(wire_server):
    client = grpcclient.InferenceServerClient(wire_server.grpc_url)
    results = []
    done = threading.Event()

    def callback(result, error):
        results.append((result, error))
        if len(results) == 3:
            done.set()

    client.start_stream(callback)
    try:
        a = np.ones((1, 3), np.float32)
        client.async_stream_infer("add", add_inputs(grpcclient, a), request_id="1")
        client.async_stream_infer("nope", add_inputs(grpcclient, a), request_id="2")
        client.async_stream_infer("add", add_inputs(grpcclient, 2 * a), request_id="3")
        assert done.wait(30)
    finally:
        client.stop_stream()
    errors = [e for _, e in results if e is not None]
    assert len(errors) == 1 and "Request for unknown model: 'nope' is not found" in str(errors[0])
    ids = sorted(r.get_response().id for r, e in results if e is None)
    assert ids == ["1", "3"]


@pytest.mark.parametrize("engine", ["builtin", "grpcio"])
def test_sigterm_lets_a_grpc_call_in_flight_finish(start_server, echo_repo, engine):
    server = start_server([echo_repo], f"--grpc-engine={engine}")
    client = grpcclient.InferenceServerClient(server.grpc_url)
    outcome = {}

    def call():
        try:
            outcome["y"] = client.infer("echo", _x(grpcclient, np.array([1.0], np.float32))).as_numpy("Y")
        except InferenceServerException as e:
            outcome["error"] = e

    thread = threading.Thread(target=call)
    thread.start()
    server.wait_until(lambda: _inflight(server) == 1, what="the call to be running")
    server.proc.send_signal(signal.SIGTERM)
    thread.join(30)
    assert "error" not in outcome, outcome.get("error")
    np.testing.assert_array_equal(outcome["y"], [1.0])
    assert server.proc.wait(30) == 0


def _inflight(server) -> float:
    return scrape_metrics(server).get('tritonmp_inflight_requests{model="echo",version="1"}', 0)


def _raw_infer(port: int, request: bytes, accept: str, method: str = "ModelInfer") -> tuple[dict, bytes]:
    """One call as a client that accepts `accept` sends it: the response's headers and its message frame."""
    headers = hpack.Encoder().encode([(":method", "POST"), (":scheme", "http"), (":path", SERVICE + method),
                                      (":authority", "localhost"), ("content-type", "application/grpc"),
                                      ("te", "trailers"), ("grpc-accept-encoding", accept)])
    message = b"\x00" + len(request).to_bytes(4, "big") + request
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + h2frame(4, 0, 0) + h2frame(1, 4, 1, headers)
                  + h2frame(0, 1, 1, message))
        frames = _read_frames(s, lambda fs: any(kind == 1 and flags & 1 for kind, flags, _ in fs))
    decoder = hpack.Decoder()
    blocks = [dict(decoder.decode(payload)) for kind, _, payload in frames if kind == 1]
    data = b"".join(payload for kind, _, payload in frames if kind == 0)
    return blocks[0], data


@pytest.mark.parametrize("engine", ["builtin", "grpcio"])
def test_infer_responses_are_compressed_at_the_level_asked_for(start_server, echo_repo, engine):
    """--grpc-infer-response-compression-level, as gRPC picks the algorithm: of gzip and deflate those the
    client accepts, the first for low, the middle for medium, the last for high; infer responses only;
    a message that compression would not shrink goes as it is; tritonclient reads them all."""
    import gzip
    import zlib

    request = pb.ModelInferRequest(model_name="echo")
    request.inputs.add(name="X", datatype="FP32", shape=[2048])
    request.raw_input_contents.append(np.zeros(2048, np.float32).tobytes())
    payload = request.SerializeToString()
    for level, accept, want in (("high", "identity,deflate,gzip", "deflate"), ("medium", "identity,deflate,gzip",
                                                                                 "deflate"),
                                ("low", "identity,deflate,gzip", "gzip"), ("high", "identity,gzip", "gzip"),
                                ("high", "identity", None), ("none", "identity,deflate,gzip", None)):
        if engine == "grpcio" and (accept != "identity,deflate,gzip" or level == "medium"):
            continue  # grpc's core negotiates these itself; the built-in engine is checked for each
        server = start_server([echo_repo], f"--grpc-engine={engine}",
                              f"--grpc-infer-response-compression-level={level}")
        head, data = _raw_infer(server.grpc_port, payload, accept)
        assert head.get("grpc-encoding") == want, (level, accept, head)
        if want is None:
            assert data[0] == 0
        else:
            assert data[0] == 1 and len(data) < 2048, (level, data[:5])
            body = data[5:5 + int.from_bytes(data[1:5], "big")]
            unpacked = gzip.decompress(body) if want == "gzip" else zlib.decompress(body)
            assert pb.ModelInferResponse.FromString(unpacked).raw_output_contents[0] == bytes(4 * 2048)
        metadata, frame = _raw_infer(server.grpc_port, b"", accept, "ServerMetadata")
        assert frame[0] == 0  # only infer responses are compressed
        assert engine == "grpcio" or "grpc-encoding" not in metadata  # grpc.aio names its algorithm on every call
        result = grpcclient.InferenceServerClient(server.grpc_url).infer("echo", _x(grpcclient, np.ones(8, np.float32)))
        assert result.as_numpy("Y").tolist() == [1.0] * 8
        server.close()
