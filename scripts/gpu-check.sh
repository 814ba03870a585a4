#!/usr/bin/env bash
# Runs every GPU test in one go, on a machine with an NVIDIA GPU and its driver.
#
#   scripts/gpu-check.sh [pytest args]
#
# Builds .venv-gpu with the gpu, tensorrt and torch extras (onnxruntime-gpu in place of onnxruntime,
# nvidia-ml-py, cuda-python, tensorrt, torch), builds the example repository, and runs the tests
# marked `gpu`: CUDA shared memory (through ONNX, python and TorchScript models on KIND_GPU
# instances), KIND_GPU placement, the TensorRT backend, onnxruntime's CUDA and TensorRT providers,
# python models' GPU tensors, the in-process API's GPU tensors, NVML metrics. A test whose framework
# is missing (no tensorrt, an onnxruntime without the CUDA provider) skips and says so.
# Where a wheel directory .whl/ exists (a machine without a package index), it installs from there.
#
#   GPU_CHECK_IN_PLACE=1 scripts/gpu-check.sh
#
# is for a machine whose image already holds the frameworks (torch, onnxruntime, cuda-bindings,
# nvidia-ml-py) and reaches no package index: it installs the wheels in .whl/ (made elsewhere by
# scripts/offline-wheels.sh) and tritonmp itself into $PYTHON's own environment, without resolving
# dependencies, and uses that environment.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v nvidia-smi >/dev/null || ! nvidia-smi -L; then
  echo "gpu-check: no NVIDIA GPU here; the GPU tests need one" >&2
  exit 1
fi
PYTHON=${PYTHON:-python3}
if [ "${GPU_CHECK_IN_PLACE:-0}" = 1 ]; then
  py=$PYTHON
  shopt -s nullglob
  wheels=(.whl/*.whl)
  [ ${#wheels[@]} -eq 0 ] || $py -m pip install -q --no-index --no-deps "${wheels[@]}"
  $py -m pip install -q --no-index --no-deps --no-build-isolation -e .
else
  venv=.venv-gpu
  py=$venv/bin/python
  pipargs=(-q)
  [ -d .whl ] && pipargs+=(--no-index --find-links .whl)
  [ -x $py ] || $PYTHON -m venv $venv
  $py -m pip install "${pipargs[@]}" -e '.[test,gpu,tensorrt,torch]'
  # onnxruntime and onnxruntime-gpu install the same module: keep only the GPU build.
  if $py -m pip show onnxruntime >/dev/null 2>&1; then
    $py -m pip uninstall -q -y onnxruntime
    $py -m pip install "${pipargs[@]}" --force-reinstall --no-deps onnxruntime-gpu
  fi
fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
$py -c 'import onnxruntime as o; print("onnxruntime", o.__version__, "providers:", o.get_available_providers())'
$py -c 'import tensorrt as t; print("tensorrt", t.__version__)' || echo "tensorrt is not installed: its tests skip"
$py -c 'import torch; print("torch", torch.__version__, "cuda:", torch.cuda.is_available())' \
  || echo "torch is not installed: its tests skip"
$py scripts/make_example_repo.py configs/model_repository
exec $py -m pytest -q -m gpu -rs "$@"
