"""Triton's in-process packages under their own names, for programs that must run unchanged (Triton's
OpenAI frontend, a deployment's own scripts): this folder holds a `tritonserver` and a `tritonfrontend`
package that are tritonmp's, so with it on the module path `import tritonserver` gives
`tritonmp.tritonserver` itself (its submodules too: `tritonserver._api._response`).

    PYTHONPATH=$(python -m tritonmp.as_triton) python program_written_for_triton.py

Nothing is installed under those names: where Triton's own packages are installed too, whichever
comes first on the module path wins."""

from __future__ import annotations

import os
import sys
from types import ModuleType


def path() -> str:
    """The folder to put on the module path."""
    return os.path.dirname(os.path.abspath(__file__))


def alias(name: str, module: ModuleType) -> None:
    """Make `name` and each of its loaded submodules the module `module` and its submodules."""
    prefix = module.__name__
    for loaded, value in list(sys.modules.items()):
        if loaded.startswith(prefix + "."):
            sys.modules[name + loaded[len(prefix):]] = value
    sys.modules[name] = module
