"""Triton datatypes: names, numpy types, element sizes, and the BYTES wire format.

Pure numpy; imported by the frontend and by workers alike.
"""

from __future__ import annotations

import struct

import numpy as np

try:  # numpy has no bfloat16 of its own; ml_dtypes (an onnx dependency) provides one.
    from ml_dtypes import bfloat16 as _bfloat16
except ImportError:  # pragma: no cover - ml_dtypes ships with onnx
    _bfloat16 = None

# Triton datatype name -> numpy dtype used to hold its values.
NUMPY_OF = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype(np.uint8),
    "UINT16": np.dtype(np.uint16),
    "UINT32": np.dtype(np.uint32),
    "UINT64": np.dtype(np.uint64),
    "INT8": np.dtype(np.int8),
    "INT16": np.dtype(np.int16),
    "INT32": np.dtype(np.int32),
    "INT64": np.dtype(np.int64),
    "FP16": np.dtype(np.float16),
    "FP32": np.dtype(np.float32),
    "FP64": np.dtype(np.float64),
    "BF16": np.dtype(_bfloat16) if _bfloat16 is not None else np.dtype(np.uint16),
    "BYTES": np.dtype(np.object_),
}

# Bytes per element; 0 for BYTES, whose elements carry their own length.
ITEMSIZE = {name: (dt.itemsize if name != "BYTES" else 0) for name, dt in NUMPY_OF.items()}

DATATYPES = tuple(NUMPY_OF)

# Triton's TRITONSERVER_DataType enum values, as the python backend exposes them.
ENUM_OF = {
    "BOOL": 1, "UINT8": 2, "UINT16": 3, "UINT32": 4, "UINT64": 5, "INT8": 6, "INT16": 7,
    "INT32": 8, "INT64": 9, "FP16": 10, "FP32": 11, "FP64": 12, "BYTES": 13, "BF16": 14,
}
NAME_OF_ENUM = {v: k for k, v in ENUM_OF.items()}


def from_config(type_name: str) -> str:
    """'TYPE_FP32' -> 'FP32'; 'TYPE_STRING' -> 'BYTES'."""
    name = type_name[5:] if type_name.startswith("TYPE_") else type_name
    return "BYTES" if name == "STRING" else name


def to_config(datatype: str) -> str:
    """'FP32' -> 'TYPE_FP32'; 'BYTES' -> 'TYPE_STRING'."""
    return "TYPE_STRING" if datatype == "BYTES" else "TYPE_" + datatype


_NAME_OF_DTYPE: dict = {}  # numeric numpy dtypes -> their Triton datatype name, as of_numpy finds them


def of_numpy(dtype: np.dtype) -> str:
    """The Triton datatype name for a numpy dtype."""
    name = _NAME_OF_DTYPE.get(dtype)
    if name is None:
        name = _find_name(dtype)
        if np.dtype(dtype).kind not in ("O", "S", "U"):  # the string kinds: one dtype per length
            _NAME_OF_DTYPE[dtype] = name
    return name


def _find_name(dtype) -> str:
    dtype = np.dtype(dtype)
    if dtype.kind in ("O", "S", "U"):
        return "BYTES"
    if _bfloat16 is not None and dtype == np.dtype(_bfloat16):
        return "BF16"
    for name, candidate in NUMPY_OF.items():
        if candidate == dtype and name != "BF16":
            return name
    raise ValueError(f"numpy dtype {dtype} has no Triton datatype")


def element_count(shape) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


def serialize_bytes(array: np.ndarray) -> bytes:
    """Triton's BYTES layout: each element as a 4-byte little-endian length, then its bytes."""
    parts = []
    pack = struct.Struct("<I").pack
    for item in np.asarray(array, dtype=np.object_).reshape(-1):
        if isinstance(item, str):
            item = item.encode("utf-8")
        elif not isinstance(item, (bytes, bytearray, memoryview)):
            item = str(item).encode("utf-8")
        parts.append(pack(len(item)))
        parts.append(bytes(item))
    return b"".join(parts)


def deserialize_bytes(buffer, count: int | None = None) -> np.ndarray:
    """Inverse of serialize_bytes: a 1-D object array of bytes. Raises ValueError when malformed."""
    view = memoryview(buffer).cast("B")
    items = []
    pos, end = 0, len(view)
    unpack = struct.Struct("<I").unpack_from
    while pos < end:
        if pos + 4 > end:
            raise ValueError("BYTES tensor ends inside an element's 4-byte length")
        (n,) = unpack(view, pos)
        pos += 4
        if pos + n > end:
            raise ValueError("BYTES tensor element runs past the end of its data")
        items.append(bytes(view[pos:pos + n]))
        pos += n
    if count is not None and len(items) != count:
        raise ValueError(f"BYTES tensor holds {len(items)} elements, its shape needs {count}")
    out = np.empty(len(items), dtype=np.object_)
    out[:] = items
    return out


def count_bytes_elements(buffer) -> int:
    """How many elements a serialized BYTES buffer holds; ValueError when malformed."""
    view = memoryview(buffer).cast("B")
    pos, end, n_items = 0, len(view), 0
    unpack = struct.Struct("<I").unpack_from
    while pos < end:
        if pos + 4 > end:
            raise ValueError("BYTES tensor ends inside an element's 4-byte length")
        (n,) = unpack(view, pos)
        pos += 4 + n
        if pos > end:
            raise ValueError("BYTES tensor element runs past the end of its data")
        n_items += 1
    return n_items


def to_buffer(datatype: str, array: np.ndarray):
    """The raw bytes of an array in the wire layout of `datatype` (a buffer, not always a copy)."""
    if datatype == "BYTES":
        return serialize_bytes(array)
    array = np.ascontiguousarray(array, dtype=NUMPY_OF[datatype])
    if not array.size:
        return b""
    if datatype == "BF16":  # a dtype numpy cannot export through the buffer protocol
        return array.reshape(-1).view(np.uint8).data
    return array.data.cast("B")
