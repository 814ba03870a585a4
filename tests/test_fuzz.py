"""Property-based fuzzing (hypothesis) of what reads untrusted bytes: the HTTP JSON and binary-tensor
decoder, the gRPC message decoder, the HTTP/2 frame layer, config.pbtxt parsing and the paths of a
load request's `file:` uploads. Every input gets a client error (ServerError, ConfigProblem) or a
correct answer, never another exception. Bounded in time (a fixed number of examples, derandomized
so CI is repeatable); the inputs that found bugs are kept as explicit examples."""

from __future__ import annotations

import asyncio
import json
import logging
import os

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from tritonclient.grpc import service_pb2 as pb

from tritonmp.errors import ServerError
from tritonmp.frontends import grpc_codec, http2, http_codec
from tritonmp.logs import get_logger
from tritonmp.repository import config as cfg
from tritonmp.validation import TensorConfig, check_request

from hostile_clients import END_HEADERS, HEADERS, PING, SETTINGS, call_block, h2frame
from http2_harness import Harness, Transport

FUZZ = settings(max_examples=300, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
DATATYPES = ["BOOL", "UINT8", "INT32", "INT64", "FP16", "FP32", "FP64", "BF16", "BYTES", "FP3", ""]
ADD_INPUTS = {"A": TensorConfig("A", "FP32", (3,), False), "B": TensorConfig("B", "FP32", (3,), False)}

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda children: st.lists(children, max_size=6) | st.dictionaries(st.text(max_size=8), children, max_size=6),
    max_leaves=30)
tensors = st.fixed_dictionaries(
    {"name": st.sampled_from(["A", "B", "C", ""]), "datatype": st.sampled_from(DATATYPES),
     "shape": st.lists(st.integers(-2, 2**40), max_size=4)},
    optional={"data": json_values, "parameters": st.dictionaries(
        st.sampled_from(["binary_data_size", "shared_memory_region", "shared_memory_byte_size", "x"]),
        st.integers(-10, 2**40) | st.text(max_size=4), max_size=2)})
infer_docs = st.fixed_dictionaries({"inputs": st.lists(tensors, max_size=3)},
                                   optional={"outputs": json_values, "parameters": json_values, "id": json_values})


def _decode_and_check(body: bytes, header_length: int | None) -> None:
    try:
        request, _ = http_codec.decode_infer(body, header_length, "add", "")
        check_request(request, "add", 8, ADD_INPUTS, {"C": "FP32"})
    except ServerError as e:
        assert e.status.http_status in (400, 404, 413, 501)
        return
    for t in request.inputs:  # what passes fits the transport's int64 shapes and the data it claims
        assert all(0 <= d < 2**63 for d in t.shape)


@FUZZ
@given(infer_docs, st.binary(max_size=64))
@example({"inputs": [{"name": "A", "datatype": "FP32", "shape": [2**40, 2**40], "data": [1]}]}, b"")
@example({"inputs": [{"name": "A", "datatype": "FP32", "shape": [0, 2**63], "data": []},
                     {"name": "B", "datatype": "FP32", "shape": [0, 3], "data": []}]}, b"")
@example({"inputs": [{"name": "A", "datatype": "BYTES", "shape": [1], "parameters": {"binary_data_size": 8}}]},
         b"\xff\xff\xff\x7fabcd")
def test_http_json_and_binary_tensors(doc, tail):
    head = json.dumps(doc).encode()  # the standard library writes integers past 64 bits too
    _decode_and_check(head + tail, len(head) if tail else None)


numbers = st.integers(-2**70, 2**70) | st.sampled_from([2**63 - 1, 2**63, 2**64 - 1, 2**64, -2**63, -2**63 - 1]) \
    | st.floats(allow_nan=False, allow_infinity=False) | st.booleans() | st.integers(-3, 300)
ITEMSIZE = {"FP32": 4, "FP64": 8, "INT32": 4, "INT64": 8, "UINT8": 1, "BOOL": 1, "BYTES": 4}


@st.composite
def common_requests(draw):
    """Requests as clients send them (JSON data or binary tensors of the declared size), now and
    then with one thing off: a size, a type, a shape, a parameter."""
    inputs, tail = [], b""
    for name in draw(st.lists(st.sampled_from(["A", "B", "C"]), max_size=3)):
        datatype = draw(st.sampled_from(["FP32", "FP32", "FP32", "INT64", "INT32", *sorted(ITEMSIZE)]))
        shape = draw(st.lists(st.integers(0, 3), max_size=3))
        if draw(st.integers(0, 9)) == 0:
            shape.append(draw(st.sampled_from([-1, 2**63 - 1, 2**63, 2**64, -2**63 - 1])))
        count = 1
        for d in shape:
            count *= max(d, 0) if abs(d) < 2**8 else 0
        item = {"name": name, "datatype": datatype, "shape": shape}
        if draw(st.booleans()):
            size = count * ITEMSIZE[datatype] + draw(st.sampled_from([0, 0, 0, 1, -1]))
            item["parameters"] = {"binary_data_size": size}
            if draw(st.integers(0, 9)) == 0:
                item["parameters"][draw(st.sampled_from(["x", "binary_data_size"]))] = draw(numbers)
            tail += b"\x01" * max(size, 0)
        else:
            off = draw(st.integers(0, 9))
            item["data"] = draw(st.lists(numbers, min_size=count, max_size=count) if off > 1 else
                                st.lists(numbers, max_size=4) if off else st.lists(st.lists(numbers, max_size=2),
                                                                                   max_size=2))
            if draw(st.integers(0, 4)) == 0:
                item["parameters"] = draw(st.none() | st.just([]) | st.just({}) | st.just("x"))
        inputs.append(item)
    doc = {"inputs": inputs}
    if draw(st.booleans()):
        output_parameters = st.none() | st.dictionaries(st.sampled_from(["binary_data", "classification"]),
                                                        st.booleans() | st.integers(0, 3), max_size=2)
        outputs = st.lists(st.fixed_dictionaries({"name": st.sampled_from(["C", ""])},
                                                 optional={"parameters": output_parameters}))
        doc["outputs"] = None if draw(st.integers(0, 9)) == 0 else draw(outputs)
    if draw(st.booleans()):
        doc["parameters"] = draw(st.none() | st.dictionaries(
            st.sampled_from(["binary_data_output", "priority", "timeout", "x", "triton_x"]),
            st.booleans() | st.integers(-1, 2**65) | st.text(max_size=2) | st.floats(allow_nan=False)
            | st.lists(st.integers(), max_size=1), max_size=2))
    if draw(st.booleans()):
        doc["id"] = draw(st.text(max_size=3)) if draw(st.integers(0, 4)) else draw(st.integers() | st.none())
    return json.dumps(doc).encode(), tail + draw(st.sampled_from([b""] * 9 + [b"\x00"]))


@settings(FUZZ, max_examples=1000)
@given(common_requests())
def test_the_typed_http_decode_takes_only_what_the_general_decode_takes_alike(request):
    """The typed decode of common requests gives up (None) or answers exactly as the general decode."""
    head, tail = request
    typed = http_codec._typed_request(head, memoryview(tail), "add", "")
    if typed is None:
        return
    general = http_codec._general_request(memoryview(head), memoryview(tail), "add", "")
    assert typed == general, head


@FUZZ
@given(st.binary(max_size=512))
def test_http_raw_bytes(body):
    _decode_and_check(body, None)


@FUZZ
@given(st.binary(max_size=512))
def test_grpc_infer_messages(raw):
    try:
        message = pb.ModelInferRequest.FromString(raw)
    except Exception:
        return  # what protobuf cannot parse is Triton's "Unable to parse request", answered by the engine
    try:
        request = grpc_codec.decode_infer(message)
        check_request(request, "add", 8, ADD_INPUTS, {"C": "FP32"})
    except ServerError as e:
        assert e.status.http_status in (400, 404, 501)


FRAME = st.tuples(st.integers(0, 12), st.integers(0, 255), st.integers(0, 7),
                  st.binary(max_size=40)).map(lambda f: len(f[3]).to_bytes(3, "big") + bytes((f[0], f[1]))
                                              + f[2].to_bytes(4, "big") + f[3])


@FUZZ
@given(st.lists(FRAME | st.binary(max_size=30), max_size=12))
def test_http2_frames(chunks):
    """Any frames after the preface: the connection answers or ends with GOAWAY, and never fails
    with an exception of its own ("HTTP/2 connection failed" is logged only for a bug)."""

    class Silent:
        def data(self, chunk):
            pass

        def end(self):
            pass

        def reset(self):
            pass

    errors = []
    handler = logging.Handler()
    handler.emit = lambda record: errors.append(record) if record.levelno >= logging.ERROR else None
    logger = get_logger("http2")  # the server's own hierarchy (tritonmp.logs)
    logger.addHandler(handler)

    async def run():
        conn = http2.Connection(lambda c, s: Silent(), keepalive=http2.Keepalive(time=0, preface_timeout=0))
        conn.connection_made(Transport())
        for chunk in (http2.PREFACE, *chunks):  # as the loop reads: into the buffer the connection gives
            view = memoryview(chunk)
            while view.nbytes and not conn.closed:
                buffer = conn.get_buffer(-1)
                n = min(buffer.nbytes, view.nbytes)
                buffer[:n] = view[:n]
                conn.buffer_updated(n)
                view = view[n:]
        conn.connection_lost(None)

    try:
        asyncio.run(run())
    finally:
        logger.removeHandler(handler)
    assert not errors, [r.getMessage() for r in errors]


@FUZZ
@given(st.text(max_size=300))
@example('name: "x" max_batch_size: -1 input [ { name: "A" data_type: TYPE_FP32 dims: [ 0 ] } ]')
@example("input { dims: [ 99999999999999999999 ] }")
def test_config_text(text):
    """Any text is parsed into a config or refused with a ConfigProblem naming the file; a parsed one is
    checked into a list of problems (never an exception), each naming the file."""
    try:
        config = cfg.parse_text(text, "config.pbtxt")
    except cfg.ConfigProblem as e:
        assert str(e).startswith("config.pbtxt: ")
        return
    problems = cfg.check_fields(config, "config.pbtxt", config.backend or "onnxruntime")
    assert isinstance(problems, list)
    for problem in problems:
        assert isinstance(problem, cfg.ConfigProblem) and str(problem).startswith("config.pbtxt: "), problem


@pytest.fixture
def model_dir(tmp_path):
    d = tmp_path / "m"
    (d / "1").mkdir(parents=True)
    (d / "1" / "model.py").write_text("")
    return d


@FUZZ
@given(st.text(max_size=300))
def test_config_files_in_a_model_directory(model_dir, text):
    (model_dir / "config.pbtxt").write_text(text)
    result = cfg.check_all(str(model_dir), auto_complete=False)
    assert isinstance(result, (list, cfg.Completed))


PATH_PARTS = st.sampled_from(["1", "model.py", "..", ".", "", "a" * 300, "x\0y", "/", "\\", "~", "config.pbtxt",
                              "é", "%2e%2e"])


@FUZZ
@given(st.lists(PATH_PARTS, min_size=1, max_size=4).map("/".join))
@example("1/" + "a" * 300)
@example("/1/model.py")
def test_upload_paths_stay_inside_the_model_directory(tmp_path, rel):
    """Upload names are written under a temporary directory four levels down in tmp_path, so that a
    name that climbed out of the model directory (up to four levels) would land where this test
    looks: every file written is inside the model directory, and nothing is left once removed."""
    import shutil
    import tempfile

    from tritonmp.lifecycle.repositories import write_files

    base = tmp_path / "a" / "b" / "c" / "d"
    base.mkdir(parents=True, exist_ok=True)

    def files_under(top):
        return [os.path.join(d, f) for d, _, names in os.walk(top) for f in names]

    saved, tempfile.tempdir = tempfile.tempdir, str(base)
    try:
        root, model = write_files("m", {rel: b"x"})
    except ServerError as e:
        assert e.message.startswith("failed to load 'm', failed to poll from model repository: ")
        assert str(tmp_path) not in e.message and "/tmp" not in e.message  # no path of the server's disk
        assert files_under(tmp_path) == [], "a refused upload left files behind"
        return
    finally:
        tempfile.tempdir = saved
    try:
        written = files_under(tmp_path)
        assert len(written) == 1, written  # the one file, and nowhere else
        assert os.path.realpath(written[0]).startswith(os.path.realpath(model) + os.sep)
        assert os.path.realpath(root).startswith(os.path.realpath(base) + os.sep)
    finally:
        shutil.rmtree(root)
    assert files_under(tmp_path) == []


_CONTROL_FRAMES = {  # a frame that asks for work without carrying a request, and one that opens a stream
    "ping": h2frame(PING, 0, 0, b"12345678"),
    "settings": h2frame(SETTINGS, 0, 0),
    "window": h2frame(SETTINGS, 0, 0, (4).to_bytes(2, "big") + (70000).to_bytes(4, "big")),
    "window_update": h2frame(8, 0, 0, (1).to_bytes(4, "big")),
    "priority": h2frame(2, 0, 1, b"\0\0\0\0\x10"),
    "empty_data": h2frame(0, 0, 1),
    "unknown": h2frame(0x20, 0, 0, b"x"),
    "continuation": h2frame(9, 0, 1),
}
_COUNTED = set(_CONTROL_FRAMES) - {"continuation"}


@FUZZ
@given(st.lists(st.tuples(st.sampled_from(sorted(_CONTROL_FRAMES)), st.integers(1, 1500)), max_size=5))
def test_http2_control_frame_floods(runs):
    """Runs of control frames on one open stream: the connection ends only with a GOAWAY of its own
    (never a failure of ours), keeps at most one partial frame, and past its control budget (less
    what its answers earned) it has ended."""
    async def go():
        h = Harness()
        await h.feed(h2frame(HEADERS, END_HEADERS, 1, call_block("ModelStreamInfer")))
        started = asyncio.get_running_loop().time()
        counted = 0
        for name, n in runs:
            await h.feed(_CONTROL_FRAMES[name] * n)
            counted += n if name in _COUNTED else 0
            assert len(h.conn.buffer) <= http2.MAX_CONTROL_FRAME + 9
        elapsed = asyncio.get_running_loop().time() - started
        return h, counted, elapsed

    h, counted, elapsed = asyncio.run(go())
    code = h.transport.goaway()
    assert code in (None, http2.ENHANCE_YOUR_CALM, http2.PROTOCOL_ERROR), code
    burst, rate = http2.CONTROL_BUDGET
    if counted > burst + rate * elapsed + 1:
        assert h.conn.closed and code is not None, (counted, code)
