"""Decoding large JSON inference requests away from the event loop. Parsing JSON tensor data makes
one Python object per element, and holds the GIL the whole time (so a thread would not help): a
30 MiB body of JSON numbers held the frontend's loop for about a second, stalling every other
client. Bodies past OFFLOAD_BYTES are decoded in a helper process instead, which returns the
request with its tensors already packed as bytes; smaller ones, nearly all of them, are decoded
in place, where a process hop would cost more than the parse.
"""

from __future__ import annotations

import asyncio
import multiprocessing
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool

from ..errors import internal
from ..inference import InferRequest
from . import http_codec

OFFLOAD_BYTES = 1 << 20

_pool: ProcessPoolExecutor | None = None


def _decode(body: bytes, model: str, version: str) -> tuple[InferRequest, bool]:
    return http_codec.decode_infer(body, None, model, version)


async def decode_infer(body: bytes | memoryview, model: str, version: str) -> tuple[InferRequest, bool]:
    """http_codec.decode_infer of a JSON-only body, in the helper process when it is large."""
    global _pool
    if len(body) <= OFFLOAD_BYTES:
        return http_codec.decode_infer(body, None, model, version)
    if _pool is None:  # started on first need; spawned, as the frontend runs threads and an event loop
        _pool = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"))
    try:
        return await asyncio.get_running_loop().run_in_executor(_pool, _decode, bytes(body), model, version)
    except BrokenProcessPool:
        _pool = None
        raise internal("the JSON decoding process ended unexpectedly; send the request again") from None


def shutdown() -> None:
    global _pool
    if _pool is not None:
        _pool.shutdown(wait=False, cancel_futures=True)
        _pool = None
