"""A gRPC response's message frame, and the compression of infer responses
(--grpc-infer-response-compression-level) as gRPC does it: the algorithm a level picks among those the
client accepts, and a message compressed with it where that makes it smaller."""

from __future__ import annotations

import gzip
import zlib

from . import http2
from .grpc_codec import WireResponse

ACCEPT_ENCODING = b"identity,deflate,gzip"
# --grpc-infer-response-compression-level: gRPC's order of its algorithms, and the response head of each
COMPRESSION_LEVELS = ("none", "low", "medium", "high")
_RANKING = (b"gzip", b"deflate")
ENCODED_HEADERS = {encoding: http2.header_block([(b":status", b"200"), (b"content-type", b"application/grpc"),
                                                  (b"grpc-encoding", encoding),
                                                  (b"grpc-accept-encoding", ACCEPT_ENCODING)])
                    for encoding in _RANKING}


def response_encoding(level: str, accepted: bytes) -> bytes:
    """How an infer response is compressed at `level`, as gRPC chooses it: of gzip and deflate (in that
    order) those the client accepts (grpc-accept-encoding), the first for low, the middle one for
    medium, the last for high; b"" (none) for level none or a client that accepts neither."""
    if level == "none":
        return b""
    offered = {a.strip() for a in accepted.split(b",")}
    supported = [a for a in _RANKING if a in offered]
    if not supported:
        return b""
    return supported[{"low": 0, "medium": len(supported) // 2, "high": len(supported) - 1}[level]]


def compressed_frame(payload, encoding: bytes) -> bytes:
    """A message frame compressed with `encoding` (gzip, or deflate: zlib's format), or the message as it
    is where compressing does not make it smaller (its flag says which)."""
    packed = gzip.compress(payload, mtime=0) if encoding == b"gzip" else zlib.compress(payload)
    if len(packed) < len(payload):
        return b"\x01" + len(packed).to_bytes(4, "big") + packed
    return b"\x00" + len(payload).to_bytes(4, "big") + bytes(payload)


def frame(message, encoding: bytes) -> bytes | list:
    """A response's gRPC message frame: bytes; or, for a message given in wire parts (large tensors) and
    not compressed, the list of its parts behind the 5-byte prefix, to be written as they are."""
    if isinstance(message, WireResponse):
        if not encoding:
            return [b"\x00" + message.nbytes.to_bytes(4, "big"), *message.parts]
        return compressed_frame(b"".join(message.parts), encoding)
    payload = message.SerializeToString()
    if encoding:
        return compressed_frame(payload, encoding)
    return b"\x00" + len(payload).to_bytes(4, "big") + payload
