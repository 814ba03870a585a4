"""HTTP/2 and gRPC framing, in process: HPACK blocks that may be cached, gRPC answers written in
wire parts, large requests parsed around their raw contents, large DATA read straight into a
handler's buffer, the lingering close."""

import asyncio
import socket

import hpack
import numpy as np
import pytest

from tritonmp.frontends import grpc_codec, http2, http_protocol
from tritonmp.inference import InferResponse, Tensor


def test_only_table_references_make_a_cacheable_header_block():
    headers = [(":method", "POST"), (":path", "/inference.GRPCInferenceService/ModelInfer"), ("te", "trailers")]
    encoder = hpack.Encoder()
    first, second = encoder.encode(headers), encoder.encode(headers)
    assert not http2._only_indexed(first)  # literals that add to the dynamic table
    assert http2._only_indexed(second)  # the same headers again: table references only
    assert not http2._only_indexed(b"\x3f\xe1\x1f" + second)  # a table size update changes the table


def test_a_grpc_answer_in_wire_parts_is_the_same_message():
    from tritonclient.grpc import service_pb2 as pb

    small = memoryview(np.ones(3, np.float32)).cast("B")
    big = memoryview(np.arange(300_000, dtype=np.float32)).cast("B")  # over WIRE_PARTS_MIN, and a 3-byte length
    response = InferResponse("m", "1", "id", [Tensor("A", "FP32", [3], small), Tensor("B", "FP32", [300_000], big),
                                             Tensor("C", "FP32", [0], None), Tensor("D", "FP32", [3], small)],
                             {"flag": True, "n": 7, "s": "x"})
    wire = grpc_codec.encode_infer_wire(response)
    assert isinstance(wire, grpc_codec.WireResponse)
    assert any(part.obj is big.obj for part in wire.parts if isinstance(part, memoryview))  # sent, never copied
    assert pb.ModelInferResponse.FromString(wire.SerializeToString()) == grpc_codec.encode_infer(response)
    assert wire.nbytes == len(wire.SerializeToString())


def test_a_large_grpc_request_parsed_around_its_raw_contents_is_the_same_request():
    from google.protobuf.message import DecodeError
    from tritonclient.grpc import service_pb2 as pb

    big = np.arange(300_000, dtype=np.float32).tobytes()  # over SPLIT_MIN
    request = pb.ModelInferRequest(model_name="m", model_version="2", id="r")
    request.inputs.add(name="A", datatype="FP32", shape=[300_000])
    request.inputs.add(name="B", datatype="FP32", shape=[3]).parameters["p"].int64_param = 4
    request.outputs.add(name="C")
    request.parameters["priority"].int64_param = 1
    request.raw_input_contents.extend([big, np.ones(3, np.float32).tobytes()])
    wire = request.SerializeToString()
    # records in any order, and an unknown field, parse as protobuf parses them
    reordered = (b"\x3a" + grpc_codec._varint(len(big)) + big + wire.replace(b"\x3a" + grpc_codec._varint(len(big))
                                                                              + big, b"") + b"\xa0\x06\x05")
    for data in (wire, reordered):
        expected = pb.ModelInferRequest.FromString(data)
        split = grpc_codec.parse_infer_request(np.frombuffer(data, np.uint8))
        assert isinstance(split, grpc_codec.SplitRequest)
        assert [bytes(r) for r in split.raw] == list(expected.raw_input_contents)
        assert all(isinstance(r, memoryview) for r in split.raw)  # views of the received bytes, not copies
        expected.ClearField("raw_input_contents")
        assert split.msg == expected
        decoded = grpc_codec.decode_infer(split)
        assert [(t.name, t.shape, bytes(t.data)) for t in decoded.inputs] == \
            [("A", [300_000], big), ("B", [3], np.ones(3, np.float32).tobytes())]
    small = pb.ModelInferRequest(model_name="m")
    assert grpc_codec.parse_infer_request(small.SerializeToString()) == small  # small: protobuf's own parse
    for bad in (wire[:-5], wire[:70_000], b"\x3a\xff\xff\xff\xff\x0f" + bytes(70_000), b"\x0f" + bytes(70_000)):
        with pytest.raises(DecodeError):  # malformed: protobuf's own error, as for a small message
            grpc_codec.parse_infer_request(bad)


def test_the_rest_of_a_large_data_frame_is_read_straight_into_the_handlers_buffer():
    """Over a real socket: the DATA frame's first bytes come with its header (through the receive
    buffer, to data()); once the handler offers its buffer, the rest is read into it."""
    uvloop = pytest.importorskip("uvloop")

    payload = bytes(range(256)) * 600  # 153,600 bytes
    first = 1000

    class Gather:
        def __init__(self):
            self.body = memoryview(bytearray(len(payload)))
            self.filled = 0
            self.direct = 0
            self.got_first = asyncio.get_running_loop().create_future()
            self.ended = asyncio.get_running_loop().create_future()

        def data(self, chunk):
            self.body[self.filled:self.filled + chunk.nbytes] = chunk
            self.filled += chunk.nbytes
            if self.filled >= first and not self.got_first.done():
                self.got_first.set_result(None)

        def receive_into(self, limit):
            return self.body[self.filled:self.filled + min(limit, len(payload) - self.filled)]

        def received_into(self, n):
            self.filled += n
            self.direct += n

        def end(self):
            self.ended.set_result(None)

        def reset(self):
            pass

    async def run():
        loop = asyncio.get_running_loop()
        handler = Gather()
        ours, theirs = socket.socketpair()
        conn = http2.Connection(lambda c, s: handler, keepalive=http2.Keepalive(time=0, preface_timeout=0))
        await loop.connect_accepted_socket(lambda: conn, ours)
        block = hpack.Encoder().encode([(":method", "POST"), (":scheme", "http"), (":path", "/x"),
                                        (":authority", "a"), ("content-type", "application/grpc")])
        head = (http2.PREFACE + http2.frame(http2.SETTINGS, 0, 0, b"")
                + http2.frame(http2.HEADERS, http2.FLAG_END_HEADERS, 1, block))
        data_header = len(payload).to_bytes(3, "big") + bytes((http2.DATA, http2.FLAG_END_STREAM)) \
            + (1).to_bytes(4, "big")
        theirs.setblocking(False)
        await loop.sock_sendall(theirs, head + data_header + payload[:first])
        await asyncio.wait_for(handler.got_first, 10)  # the first bytes reach data() through the receive buffer
        await loop.sock_sendall(theirs, payload[first:])
        await asyncio.wait_for(handler.ended, 10)
        theirs.close()
        return handler

    handler = uvloop.run(run())
    assert bytes(handler.body) == payload
    assert handler.direct == len(payload) - first


def test_a_lingering_close_drops_what_comes_until_its_byte_limit_then_closes():
    class Transport:  # the one call _Drain makes
        closed = 0

        def close_now(self):
            self.closed += 1

    transport = Transport()
    drain = http_protocol._Drain(transport)
    chunk = b"x" * (1 << 20)
    for _ in range(http_protocol.LINGER_BYTES // len(chunk)):
        drain.feed_data(chunk)
    assert transport.closed == 0 and drain.dropped == http_protocol.LINGER_BYTES
    drain.feed_data(b"x")
    assert transport.closed == 1
