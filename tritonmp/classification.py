"""Triton's classification extension: an output requested with `classification: k` comes back as
its k largest values, as BYTES "value:index[:label]" strings, largest first."""

from __future__ import annotations

import os

import numpy as np

from . import datatypes
from .errors import invalid
from .inference import Tensor


def read_labels(model_dir: str, config) -> dict[str, list[str]]:
    """Output name -> its labels (one per line of the output's label_filename)."""
    labels = {}
    for output in config.output:
        if output.label_filename:
            path = os.path.join(model_dir, output.label_filename)
            with open(path, encoding="utf-8") as f:
                labels[output.name] = [line.rstrip("\n") for line in f]
    return labels


def class_count(parameters: dict, output: str) -> int:
    k = parameters.get("classification")
    if k is None:
        return 0
    if isinstance(k, bool) or not isinstance(k, int) or k < 0:  # 0: not classified, as Triton's HTTP takes it
        raise invalid(f"the classification count of output '{output}' must be a positive integer")
    return k


def classify(t: Tensor, k: int, batched: bool, labels: list[str] | None) -> Tensor:
    if t.data is None:
        raise invalid(f"output '{t.name}' cannot be both classified and written into shared memory")
    if t.datatype in ("BYTES", "BOOL"):
        raise invalid(f"classification needs a numeric output; '{t.name}' is {t.datatype}")
    values = np.frombuffer(t.data, dtype=datatypes.NUMPY_OF[t.datatype])
    if t.datatype == "BF16":
        values = values.astype(np.float32)
    rows = values.reshape(t.shape[0] if batched and t.shape else 1, -1)
    k = min(k, rows.shape[1])
    integral = values.dtype.kind in "iu"  # Triton writes integer values as integers, floats with %f
    out = []
    for row in rows:
        order = np.argsort(-row.astype(np.float64), kind="stable")[:k]
        for i in order:
            text = f"{int(row[i])}:{int(i)}" if integral else f"{float(row[i]):f}:{int(i)}"
            if labels is not None and i < len(labels):
                text += f":{labels[i]}"
            out.append(text.encode())
    shape = [rows.shape[0], k] if batched else [k]
    return Tensor(t.name, "BYTES", shape, datatypes.serialize_bytes(np.array(out, dtype=np.object_)))
