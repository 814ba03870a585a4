"""The `serve` command of a SageMaker container: SageMaker starts an inference image as `docker run
IMAGE serve`, and this turns SageMaker's environment into tritonmp's command line, as Triton's own
SageMaker image does, then runs the server with SageMaker's endpoint alone.

A single model's archive is unpacked into /opt/ml/model (one model folder, or several with
SAGEMAKER_TRITON_DEFAULT_MODEL_NAME naming the one /invocations serves); with SAGEMAKER_MULTI_MODEL=true
models come and go through /models and the repository given is an empty folder. The SAGEMAKER_* settings
read: BIND_TO_PORT, SAFE_PORT_RANGE, TRITON_LOG_VERBOSE (on unless set), TRITON_LOG_INFO, TRITON_LOG_WARNING,
TRITON_LOG_ERROR, TRITON_THREAD_COUNT, TRITON_BUFFER_MANAGER_THREAD_COUNT, TRITON_SHM_DEFAULT_BYTE_SIZE,
TRITON_SHM_GROWTH_BYTE_SIZE, TRITON_TENSORFLOW_VERSION, TRITON_MODEL_LOAD_GPU_LIMIT,
TRITON_DISABLE_MODEL_NAMESPACING, TRITON_DEFAULT_MODEL_NAME, MULTI_MODEL.

    python -m tritonmp.sagemaker_serve [--model-dir DIR]   (DIR: /opt/ml/model, as SageMaker mounts it)
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

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
    if multi:
        os.makedirs(MULTI_MODEL_DIR, exist_ok=True)
    else:
        args.append(f"--load-model={_default_model(model_dir, environ, env)}")
    return ["--allow-sagemaker=true", "--allow-grpc=false", "--allow-http=false", "--allow-metrics=false",
            "--model-control-mode=explicit", *args], env


def _default_model(model_dir: str, environ: Mapping[str, str], env: dict[str, str]) -> str:
    """The model /invocations serves: SAGEMAKER_TRITON_DEFAULT_MODEL_NAME's folder, or the one folder."""
    if os.path.isfile(os.path.join(model_dir, "config.pbtxt")):
        raise ServeError(f"{model_dir} holds config.pbtxt itself: the model archive must hold the model's folder "
                         "(MODEL/config.pbtxt, MODEL/1/...)")
    name = environ.get("SAGEMAKER_TRITON_DEFAULT_MODEL_NAME", "")
    if name:
        if not os.path.isdir(os.path.join(model_dir, name)):
            raise ServeError(f"SAGEMAKER_TRITON_DEFAULT_MODEL_NAME is '{name}', and {model_dir} has no folder of "
                             "that name")
        return name
    folders = sorted(f for f in os.listdir(model_dir) if os.path.isdir(os.path.join(model_dir, f))) \
        if os.path.isdir(model_dir) else []
    if not folders:
        raise ServeError(f"no model folder in {model_dir}")
    if len(folders) > 1:
        raise ServeError(f"{len(folders)} model folders in {model_dir} ({', '.join(folders)}): set "
                         "SAGEMAKER_TRITON_DEFAULT_MODEL_NAME to the one /invocations serves (an ensemble's, to "
                         "serve them all)")
    print(f"SAGEMAKER_TRITON_DEFAULT_MODEL_NAME is not set: serving the one model folder, {folders[0]}",
          file=sys.stderr)
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
        print(f"error: {e}", file=sys.stderr)
        return 1
    os.environ.clear()
    os.environ.update(env)
    from .cli import main as serve

    return serve(args)


if __name__ == "__main__":
    sys.exit(main())
