#!/usr/bin/env bash
# Runs every GPU test in one go, on a machine with an NVIDIA GPU and its driver.
#
#   scripts/gpu-check.sh [pytest args]
#
# Builds .venv-gpu with the gpu, tensorrt and torch extras (onnxruntime-gpu in place of onnxruntime,
# nvidia-ml-py, cuda-python, tensorrt, torch), builds the example repository, and runs the tests
# marked `gpu`: CUDA shared memory, KIND_GPU placement, the TensorRT backend, onnxruntime's TensorRT
# provider, python models' GPU tensors, the in-process API's GPU tensors. Where a wheel directory
# .whl/ exists (a machine without a package index), it installs from there.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v nvidia-smi >/dev/null || ! nvidia-smi -L; then
  echo "gpu-check: no NVIDIA GPU here; the GPU tests need one" >&2
  exit 1
fi
PYTHON=${PYTHON:-python3}
venv=.venv-gpu
pipargs=(-q)
[ -d .whl ] && pipargs+=(--no-index --find-links .whl)
[ -x $venv/bin/python ] || $PYTHON -m venv $venv
$venv/bin/python -m pip install "${pipargs[@]}" -e '.[test,gpu,tensorrt,torch]'
# onnxruntime and onnxruntime-gpu install the same module: keep only the GPU build.
if $venv/bin/python -m pip show onnxruntime >/dev/null 2>&1; then
  $venv/bin/python -m pip uninstall -q -y onnxruntime
  $venv/bin/python -m pip install "${pipargs[@]}" --force-reinstall --no-deps onnxruntime-gpu
fi
$venv/bin/python -c 'import onnxruntime as o; print("onnxruntime providers:", o.get_available_providers())'
$venv/bin/python -c 'import tensorrt as t; print("tensorrt", t.__version__)'
$venv/bin/python scripts/make_example_repo.py configs/model_repository
exec $venv/bin/python -m pytest -q -m gpu -rs "$@"
