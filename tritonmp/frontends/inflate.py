"""Inflating compressed request bodies and gRPC messages without trusting them: the output is
bounded (a decompression bomb stops at the limit, having allocated no more than that), and the work
is cut into slices with the event loop let run between them, so other clients are never stalled
while a large body inflates."""

from __future__ import annotations

import asyncio
import zlib

SLICE = 1 << 20  # bytes of output between two turns of the event loop
WBITS = {"gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS, "x-gzip": 16 + zlib.MAX_WBITS}


class TooLarge(Exception):
    """The inflated data would exceed the limit."""


async def inflate(data: bytes | bytearray | memoryview, encoding: str, limit: int) -> bytes:
    """`data` inflated; ValueError for an encoding that is not gzip or deflate, zlib.error for data
    that is not what it claims, TooLarge once the output passes `limit` bytes."""
    wbits = WBITS.get(encoding)
    if wbits is None:
        raise ValueError(encoding)
    inflater = zlib.decompressobj(wbits)
    out = bytearray()
    pending = data
    while True:
        out += inflater.decompress(pending, SLICE)
        if len(out) > limit:
            raise TooLarge(len(out))
        pending = inflater.unconsumed_tail
        if not pending:
            break
        await asyncio.sleep(0)
    out += inflater.flush()
    if len(out) > limit:
        raise TooLarge(len(out))
    if not inflater.eof:
        raise zlib.error("the compressed data ends before its end marker")
    return bytes(out)
