"""HTTP/1.1 and its JSON codec, in process: responses of one turn written together, shared response
headers, JSON tensor data packed and written as numpy would."""

import asyncio
import gc
import weakref

import numpy as np
import orjson

from tritonmp import datatypes
from tritonmp.errors import ServerError
from tritonmp.frontends import http_codec, http_headers, http_protocol
from tritonmp.inference import Tensor


class _RecordingTransport:
    """The parts of an asyncio transport that CoalescingTransport uses, recording what is sent."""

    def __init__(self, sent: list, name: str):
        self.sent, self.name = sent, name

    def writelines(self, parts) -> None:
        self.sent.append((self.name, b"".join(parts)))

    def is_closing(self) -> bool:
        return False

    def close(self) -> None:
        self.sent.append((self.name, "closed"))

    pause_reading = resume_reading = get_write_buffer_size = is_closing


def test_http_responses_of_one_turn_go_out_together_at_its_end():
    from tritonmp.frontends.http_protocol import CoalescingTransport

    ended = []  # a weak reference to the loop, once it has run

    async def run() -> tuple[list, list, list]:
        loop = asyncio.get_running_loop()
        ended.append(weakref.ref(loop))
        sent: list = []
        a = CoalescingTransport(_RecordingTransport(sent, "a"), loop)
        b = CoalescingTransport(_RecordingTransport(sent, "b"), loop)
        a.writelines([b"head a ", b"body a"])
        b.write(b"head b ")
        b.write(b"body b")
        a.write(b"; next a")
        during = list(sent)  # nothing is sent while the turn goes on
        await asyncio.sleep(0)
        after_turn = list(sent)
        b.write(b"late")
        b.close()  # closing sends what is pending first
        return during, after_turn, sent

    during, after_turn, sent = asyncio.run(run())
    assert during == []
    assert after_turn == [("a", b"head a body a; next a"), ("b", b"head b body b")]  # one call each
    assert sent[2:] == [("b", b"late"), ("b", "closed")]
    gc.collect()
    # an ended loop is let go: its outbox does not keep it (other libraries may keep their own loops)
    assert ended[0]() is None


def test_binary_response_headers_are_shared_per_length_and_bounded():
    """A binary response's own headers are one kept list per JSON header length, so the protocol
    reuses its head; however many lengths come, a bounded number of lists is kept."""
    first = http_headers.binary_headers(137)
    assert first is http_headers.binary_headers(137)
    assert first == [(b"content-type", b"application/octet-stream"), (b"inference-header-content-length", b"137")]
    assert type(first) is http_protocol.KeptHeaders and type(http_protocol.JSON_HEADERS) is http_protocol.KeptHeaders
    for n in range(http_headers._KEPT + 10):
        assert http_headers.binary_headers(n)[1] == (b"inference-header-content-length", b"%d" % n)
    assert len(http_headers._BINARY_HEADERS) <= http_headers._KEPT


def test_json_tensor_data_packs_as_numpy_would_for_every_datatype_and_value():
    """Flat JSON number lists of the common datatypes are packed without numpy; whatever numpy makes
    of a list (bytes, or a refusal) must stay the answer."""
    values = [0, 1, -1, 127, 128, 255, 256, -129, 2**15, 2**16, 2**31 - 1, 2**31, -2**31 - 1, 2**32, 2**63 - 1,
              2**63, 2**64 - 1, 2**64, -2**63, -2**63 - 1, True, False, 0.5, -0.5, 1.0, 1e300, -1e300,
              float("inf"), 3.4e38, 1e-46, 10**39, 1.5e10, "1", None, [1]]
    assert {"FP32", "INT32", "INT64", "UINT8"} <= set(http_codec._ARRAY_CODES)  # the fast path is taken here
    for datatype in ["BOOL", "FP16", *http_codec._ARRAY_CODES]:
        for data in [[v] for v in values] + [[v, w] for v in values[::3] for w in values[1::4]] + [[], [[1, 2]]]:
            for shape in ([len(data)], [len(data) + 1]):
                try:
                    with np.errstate(all="ignore"):
                        expected = np.asarray(data, dtype=datatypes.NUMPY_OF[datatype])
                    expected = expected.tobytes() if expected.size == shape[0] else None
                except (ValueError, TypeError, OverflowError):
                    expected = None
                try:
                    with np.errstate(all="ignore"):
                        got = http_codec._json_data("x", datatype, shape, data)
                except ServerError as e:
                    assert e.message.startswith("Unable to parse 'data': ")
                    got = None
                assert got == expected, (datatype, data, shape)


def test_json_outputs_small_and_large_are_written_alike_fp32_as_doubles():
    from tritonmp.frontends.http_codec import SMALL_JSON_OUTPUT, _json_values

    for dt in ("FP32", "FP64", "INT8", "UINT8", "INT16", "UINT16", "INT32", "UINT32", "INT64", "UINT64"):
        dtype = datatypes.NUMPY_OF[dt]
        info = np.finfo(dtype) if dt.startswith("FP") else np.iinfo(dtype)
        values = np.array([0, 1, info.min, info.max] + ([0.1, 1e-3, -2.5] if dt.startswith("FP") else []), dtype)
        small = values.tobytes()
        large = np.resize(values, SMALL_JSON_OUTPUT // values.itemsize + 1).tobytes()
        for data in (small, memoryview(small), large):
            written = orjson.loads(orjson.dumps(_json_values(Tensor("t", dt, [-1], data, {})),
                                                option=orjson.OPT_SERIALIZE_NUMPY))
            expected = np.frombuffer(data, dtype).tolist()  # Python ints, or the values as doubles
            assert written == expected, dt
    tenth = Tensor("t", "FP32", [1], np.float32(0.1).tobytes(), {})
    assert orjson.dumps(_json_values(tenth)) == b"[0.10000000149011612]"
