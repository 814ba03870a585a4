"""Run a python model's `TritonPythonModel.auto_complete_config` in a short-lived process.

    python -m tritonmp.workers.autocomplete MODEL_PY   (the config as JSON on stdin)

Prints the completed config as JSON on stdout, or the error on stderr with exit code 1. The model
file is imported here, never in the frontend.
"""

from __future__ import annotations

import json
import sys
import traceback

from . import pb_utils
from .python_backend import import_model_file, install_utils_module


def main() -> int:
    path = sys.argv[1]
    config = json.loads(sys.stdin.read())
    install_utils_module()
    try:
        module = import_model_file(path, "autocomplete")
        # a file with no TritonPythonModel has nothing to complete: its load says what it lacks
        completer = getattr(getattr(module, "TritonPythonModel", None), "auto_complete_config", None)
        if completer is not None:
            result = completer(pb_utils.ModelConfig(config))
            config = result.as_dict() if isinstance(result, pb_utils.ModelConfig) else config
    except Exception as e:
        detail = traceback.format_exc(limit=-2)
        print(f"auto_complete_config failed: {type(e).__name__}: {e}\n{detail}", file=sys.stderr)
        return 1
    json.dump(config, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
