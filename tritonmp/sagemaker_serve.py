"""The `serve` command of a SageMaker container: SageMaker starts an inference image as `docker run
IMAGE serve`, and this turns SageMaker's environment into tritonmp's command line, as Triton's own
SageMaker image does, then runs the server with SageMaker's endpoint (HTTP off; gRPC and metrics as
configured).

A single model's archive is unpacked into /opt/ml/model (one model folder, or several with
SAGEMAKER_TRITON_DEFAULT_MODEL_NAME naming the one /invocations serves); with SAGEMAKER_MULTI_MODEL=true
models come and go through /models and the repository given is an empty folder. The SAGEMAKER_* settings
read: BIND_TO_PORT, SAFE_PORT_RANGE, TRITON_LOG_VERBOSE (on unless set), TRITON_LOG_INFO, TRITON_LOG_WARNING,
TRITON_LOG_ERROR, TRITON_THREAD_COUNT, TRITON_BUFFER_MANAGER_THREAD_COUNT, TRITON_SHM_DEFAULT_BYTE_SIZE,
TRITON_SHM_GROWTH_BYTE_SIZE, TRITON_TENSORFLOW_VERSION, TRITON_MODEL_LOAD_GPU_LIMIT,
TRITON_DISABLE_MODEL_NAMESPACING, TRITON_DEFAULT_MODEL_NAME, TRITON_INFERENCE_TYPE (checked here),
TRITON_ADDITIONAL_ARGS (more flags), MULTI_MODEL.

    python -m tritonmp.sagemaker_serve [--model-dir DIR]   (DIR: /opt/ml/model, as SageMaker mounts it)
"""

from __future__ import annotations

import os
import shlex
import sys
from collections.abc import Mapping

from .frontends.sagemaker import INFERENCE_TYPES

SINGLE_MODEL_DIR = "/opt/ml/model"
MULTI_MODEL_DIR = "/tmp/sagemaker"  # an empty repository: multi-model endpoints register each model's own

# SAGEMAKER_<name> -> the flag it sets, where it is set
_PASSED = {"BIND_TO_PORT": "--sagemaker-port", "SAFE_PORT_RANGE": "--sagemaker-safe-port-range",
           "TRITON_BUFFER_MANAGER_THREAD_COUNT": "--buffer-manager-thread-count",
           "TRITON_THREAD_COUNT": "--sagemaker-thread-count", "TRITON_LOG_INFO": "--log-info",
           "TRITON_LOG_WARNING": "--log-warning", "TRITON_LOG_ERROR": "--log-error"}


class ServeError(Exception):
    """A model folder SageMaker's single-model mode cannot serve."""


def arguments(environ: Mapping[str, str], model_dir: str = SINGLE_MODEL_DIR) -> tuple[list[str], dict[str, str]]:
    """The server's command line for SageMaker's environment, and the environment to run it with."""
    env = dict(environ)
    multi = environ.get("SAGEMAKER_MULTI_MODEL") == "true"
    repository = MULTI_MODEL_DIR if multi else model_dir
    args = [f"--model-repository={repository}",
            f"--model-namespacing={environ.get('SAGEMAKER_TRITON_DISABLE_MODEL_NAMESPACING', 'true')}"]
    args += [f"{flag}={environ[f'SAGEMAKER_{name}']}" for name, flag in _PASSED.items()
             if environ.get(f"SAGEMAKER_{name}")]
    args.append(f"--log-verbose={environ.get('SAGEMAKER_TRITON_LOG_VERBOSE') or 'true'}")
    shm = environ.get("SAGEMAKER_TRITON_SHM_DEFAULT_BYTE_SIZE") or "16777216"
    growth = environ.get("SAGEMAKER_TRITON_SHM_GROWTH_BYTE_SIZE") or "1048576"
    args += [f"--backend-config=python,shm-default-byte-size={shm}",
             f"--backend-config=python,shm-growth-byte-size={growth}"]
    if environ.get("SAGEMAKER_TRITON_TENSORFLOW_VERSION"):
        args.append(f"--backend-config=tensorflow,version={environ['SAGEMAKER_TRITON_TENSORFLOW_VERSION']}")
    if environ.get("SAGEMAKER_TRITON_MODEL_LOAD_GPU_LIMIT"):
        from .gpus import visible_gpus

        args += [f"--model-load-gpu-limit={gpu}:{environ['SAGEMAKER_TRITON_MODEL_LOAD_GPU_LIMIT']}"
                 for gpu in range(len(visible_gpus()))]
    args += shlex.split(environ.get("SAGEMAKER_TRITON_ADDITIONAL_ARGS", ""))
    if not multi and os.path.isfile(os.path.join(model_dir, "config.pbtxt")):
        raise ServeError("ERROR: Incorrect directory structure.\n"
                         "       Model directory needs to contain the top level folder")
    kind = environ.get("SAGEMAKER_TRITON_INFERENCE_TYPE", "")
    if kind and kind not in INFERENCE_TYPES:
        raise ServeError(f"ERROR: Invalid SAGEMAKER_TRITON_INFERENCE_TYPE '{kind}'\n"
                         f"       Must be one of: {', '.join(INFERENCE_TYPES)}")
    if multi:
        os.makedirs(MULTI_MODEL_DIR, exist_ok=True)
    else:
        args.append(f"--load-model={_default_model(model_dir, environ, env)}")
    return ["--allow-sagemaker=true", "--allow-http=false", "--model-control-mode=explicit", *args], env


def _default_model(model_dir: str, environ: Mapping[str, str], env: dict[str, str]) -> str:
    """The model /invocations serves: SAGEMAKER_TRITON_DEFAULT_MODEL_NAME's folder, or the one folder.
    The refusals are in the words of Triton's own `serve`, which SageMaker users look for."""
    name = environ.get("SAGEMAKER_TRITON_DEFAULT_MODEL_NAME", "")
    if name:
        if not os.path.isdir(os.path.join(model_dir, name)):
            raise ServeError(f"ERROR: Directory with provided SAGEMAKER_TRITON_DEFAULT_MODEL_NAME {name} does not "
                             "exist")
        return name
    folders = sorted(f for f in os.listdir(model_dir) if os.path.isdir(os.path.join(model_dir, f))) \
        if os.path.isdir(model_dir) else []
    if not folders:
        raise ServeError("ERROR: No model found in model repository")
    if len(folders) > 1:
        raise ServeError("ERROR: More than 1 model directory found in model repository.\n"
                         "       Either provide a single directory or set SAGEMAKER_TRITON_DEFAULT_MODEL_NAME to run "
                         "the ensemble backend.\n"
                         f"       Directories found in model repository: {' '.join(folders)}")
    print("WARNING: No SAGEMAKER_TRITON_DEFAULT_MODEL_NAME provided.\n"
          f"         Starting with the only existing model directory {folders[0]}", flush=True)
    env["SAGEMAKER_TRITON_DEFAULT_MODEL_NAME"] = folders[0]
    return folders[0]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    model_dir = SINGLE_MODEL_DIR
    if argv[:1] == ["--model-dir"] and len(argv) == 2:
        model_dir = argv[1]
    elif argv:
        print(__doc__.strip().splitlines()[-1].strip(), file=sys.stderr)
        return 2
    try:
        args, env = arguments(os.environ, model_dir)
    except ServeError as e:
        print(e, flush=True)
        return 1
    os.environ.clear()
    os.environ.update(env)
    from .cli import main as serve

    return serve(args)


if __name__ == "__main__":
    sys.exit(main())
