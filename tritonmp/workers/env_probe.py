"""Run in a python model's own environment (tritonmp.repository.python_envs) before its workers: prints
the environment's Python and numpy versions as JSON, then imports what a python model's worker
imports, so that an environment the worker cannot run with fails its load with the reason (the
import's error, on stderr) instead of a worker dying at start.

    <env>/bin/python ... tritonmp.workers.env_probe
"""

from __future__ import annotations

import json
import platform
import sys


def main() -> int:
    facts: dict[str, object] = {"python": platform.python_version()}
    try:
        import numpy
    except ImportError:
        print(json.dumps(facts), flush=True)
        raise
    facts["numpy"] = numpy.__version__
    facts["numpy_version"] = [int(p) for p in numpy.__version__.split(".")[:2] if p.isdigit()]
    print(json.dumps(facts), flush=True)
    import tritonmp.workers.python_backend  # noqa: F401  (what a worker of a python model imports)

    return 0


if __name__ == "__main__":
    sys.exit(main())
