"""Inflating compressed request bodies and gRPC messages without trusting them: the output is
bounded (a decompression bomb stops at the limit, having allocated no more than that), and the work
is cut into slices with the event loop let run between them, so other clients are never stalled
while a large body inflates."""

from __future__ import annotations

import asyncio
import zlib
from collections.abc import Callable

SLICE = 1 << 20  # bytes of output between two turns of the event loop
WBITS = {"gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS, "x-gzip": 16 + zlib.MAX_WBITS}


class TooLarge(Exception):
    """The inflated data would exceed the limit."""


async def inflate(data: bytes | bytearray | memoryview, encoding: str, limit: int,
                  check: Callable[[bytes], None] | None = None) -> bytes:
    """`data` inflated; ValueError for an encoding that is not gzip or deflate, zlib.error for data
    that is not what it claims, TooLarge once the output passes `limit` bytes. `check`, if given,
    sees each piece of output as it comes and may raise to stop there (see protobuf_framing). The
    pieces are joined once, at the end: the output's bytes are copied once, never moved as it grows."""
    wbits = WBITS.get(encoding)
    if wbits is None:
        raise ValueError(encoding)
    inflater = zlib.decompressobj(wbits)
    pieces: list[bytes] = []
    size = 0
    pending = data
    while True:
        piece = inflater.decompress(pending, SLICE) if pending else inflater.flush()
        size += len(piece)
        if size > limit:
            raise TooLarge(size)
        if piece:
            if check is not None:
                check(piece)
            pieces.append(piece)
        if not pending:
            break
        pending = inflater.unconsumed_tail
        await asyncio.sleep(0)
    if not inflater.eof:
        raise zlib.error("the compressed data ends before its end marker")
    return pieces[0] if len(pieces) == 1 else b"".join(pieces)
