"""Triton's local response cache (`--cache-config local,size=BYTES` and a model's
`response_cache { enable: true }`): identical requests get the stored response without running
the model. Keys hash the model version, every input's name, type, shape and bytes, and the
requested outputs; least recently used entries go first when the cache is full."""

from __future__ import annotations

import hashlib
from collections import OrderedDict

import orjson

from ..errors import invalid
from ..inference import InferRequest, InferResponse, Tensor


def _nbytes(data) -> int:
    return data.nbytes if isinstance(data, memoryview) else len(data)


class ResponseCache:
    def __init__(self, size_bytes: int):
        self.size = size_bytes
        self.used = 0
        self.entries: OrderedDict[bytes, tuple[list[Tensor], int]] = OrderedDict()

    @staticmethod
    def key(request: InferRequest, model: str, version: int) -> bytes | None:
        """The request's key, or None when it cannot be cached (bytes in client shared memory)."""
        h = hashlib.blake2b(digest_size=20)
        h.update(f"{model}\0{version}\0".encode())
        for t in request.inputs:
            if not isinstance(t.data, (bytes, bytearray, memoryview)):
                return None
            h.update(f"{t.name}\0{t.datatype}\0{t.shape}\0".encode())
            h.update(t.data)
        if request.outputs is not None:
            for o in request.outputs:
                if o.shm is not None:
                    return None
                h.update(orjson.dumps([o.name, o.parameters], option=orjson.OPT_SORT_KEYS))
        return h.digest()

    def get(self, key: bytes, request: InferRequest, model: str, version: str) -> InferResponse | None:
        entry = self.entries.get(key)
        if entry is None:
            return None
        self.entries.move_to_end(key)
        outputs = [Tensor(t.name, t.datatype, list(t.shape), t.data) for t in entry[0]]
        return InferResponse(model, version, request.id, outputs)

    def put(self, key: bytes, response: InferResponse) -> None:
        outputs = [Tensor(t.name, t.datatype, list(t.shape), bytes(t.data)) for t in response.outputs]
        nbytes = sum(len(t.data) for t in outputs) + 256
        if nbytes > self.size:
            return
        old = self.entries.pop(key, None)
        if old is not None:
            self.used -= old[1]
        while self.used + nbytes > self.size and self.entries:
            _, (_, freed) = self.entries.popitem(last=False)
            self.used -= freed
        self.entries[key] = (outputs, nbytes)
        self.used += nbytes


def from_flags(cache_config: list[str]) -> ResponseCache | None:
    """--cache-config values, Triton's `local,size=BYTES`."""
    size = None
    for item in cache_config:
        kind, _, setting = item.partition(",")
        key, _, value = setting.partition("=")
        if kind != "local":
            raise invalid(f"--cache-config '{item}': only the 'local' cache is available here")
        if key != "size" or not value.isdigit():
            raise invalid(f"--cache-config '{item}': expected local,size=BYTES")
        size = int(value)
    return ResponseCache(size) if size else None
