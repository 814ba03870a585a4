"""Python-based backends, by Triton's rules: a backend written in Python is a directory of the backend
directory (--backend-directory) holding its `model.py`, and a model selects it with `backend: "<name>"`.
The model's config may name the backend's file in its `runtime` field; Triton reads only `model.py`
there as a python-based backend's (any other runtime is a C++ library). Without a runtime, Triton
looks for the backend's C++ library first (none is served here) and then for `<dir>/<name>/model.py`,
and writes `runtime: "model.py"` into the config. Such a model runs on the python backend with the
backend's code, its version directories need no model file, and where its config names no
EXECUTION_ENV_PATH, the backend directory's `pb_exec_env_model.py.tar.gz` is its environment."""

from __future__ import annotations

import os
from dataclasses import dataclass

from tritonclient.grpc import model_config_pb2 as mc

from .problems import ConfigProblem

PYTHON_FILE = "model.py"  # the one runtime Triton reads as a python-based backend's
ENV_PARAMETER = "EXECUTION_ENV_PATH"


@dataclass(frozen=True)
class PythonBased:
    """A model's python-based backend: its name and the code every model of it runs."""

    name: str
    code_file: str


def find(config: mc.ModelConfig, backend_directory: str, path: str) -> PythonBased:
    """The python-based backend `config.backend` names, with the config's `runtime` completed and its
    EXECUTION_ENV_PATH defaulted to the backend's own archive; ConfigProblem where there is none."""
    name, runtime = config.backend, config.runtime
    if not name or name in (".", "..") or "/" in name or "\\" in name:
        raise ConfigProblem(path, "backend", f"backend '{name}' is not a backend name")
    if runtime and runtime != PYTHON_FILE:
        raise ConfigProblem(path, "runtime", f"runtime '{runtime}' of backend '{name}' is a C++ backend library, "
                            f"which this server does not load; a python-based backend's runtime is '{PYTHON_FILE}'")
    if not backend_directory:
        raise ConfigProblem(path, "backend", f"unable to find backend library for backend '{name}': no "
                            "--backend-directory is given, where a python-based backend's model.py would be")
    backend_dir = os.path.join(backend_directory, name)
    code_file = os.path.join(backend_dir, PYTHON_FILE)
    if not os.path.isfile(code_file):
        if runtime:  # Triton's words where the config named the file
            raise ConfigProblem(path, "runtime", f"unable to find Python backend based backend library "
                                f"'{runtime}' for model '{config.name}', searched: '{code_file}'")
        raise ConfigProblem(path, "backend", f"unable to find backend library for backend '{name}', try specifying "
                            f"runtime on the model configuration (no {code_file})")
    config.runtime = PYTHON_FILE
    if ENV_PARAMETER not in config.parameters:
        archive = os.path.join(backend_dir, f"pb_exec_env_{PYTHON_FILE}.tar.gz")
        if os.path.isfile(archive):
            config.parameters[ENV_PARAMETER].string_value = archive
    return PythonBased(name, code_file)
