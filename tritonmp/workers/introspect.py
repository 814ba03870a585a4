"""Read a framework model's inputs and outputs in a short-lived process, for auto-complete and
`tritonmp check` (the frontend never imports a framework).

    python -m tritonmp.workers.introspect BACKEND MODEL_FILE   (the config as JSON on stdin)

Prints {"inputs": [...], "outputs": [...]} (each {"name", "datatype", "shape"}, shape null where
the rank is unknown), and "max_batch_size" where the model itself bounds its batch (a TensorRT
engine's profiles), on stdout; or the reason on stderr's last line with exit code 1.
"""

from __future__ import annotations

import importlib
import json
import sys
from collections.abc import Callable

from .. import backends
from .backend import BackendError


def describe(backend: str, path: str, config: dict) -> tuple:
    """The model's tensors, read by its backend's module (its `describe(path, config)`)."""
    described = backends.get(backend)
    if described is None or described.tensors_from != "framework":
        raise BackendError(f"the {backend} backend's models are not read here")
    module = importlib.import_module(f"tritonmp.workers.{described.worker.split(':')[0]}")
    read: Callable[[str, dict], tuple] = module.describe
    return read(path, config)


def main() -> int:
    backend, path = sys.argv[1], sys.argv[2]
    config = json.loads(sys.stdin.read())
    try:
        described = describe(backend, path, config)
    except BackendError as e:
        print(str(e), file=sys.stderr)
        return 1
    except Exception as e:
        print(f"the {backend} backend cannot read the model: {type(e).__name__}: {e}".replace("\n", " "),
              file=sys.stderr)
        return 1
    doc = {"inputs": described[0], "outputs": described[1]}
    if len(described) > 2:
        doc["max_batch_size"] = described[2]
    json.dump(doc, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
