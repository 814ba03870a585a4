#!/usr/bin/env bash
# Downloads into .whl/ the wheels that tritonmp and its tests need beyond what a machine's image
# already holds, for a machine that reaches no package index (scripts/gpu-check.sh installs them
# there with GPU_CHECK_IN_PLACE=1). Versions come from constraints.txt.
#
#   scripts/offline-wheels.sh [python version, default 3.12] [package ...]
#
# With no packages named, it fetches the ones a CUDA image with torch, onnxruntime, numpy,
# cuda-bindings, nvidia-ml-py, uvloop and prometheus-client lacks.
set -euo pipefail
cd "$(dirname "$0")/.."
version=${1:-3.12}
shift || true
packages=("$@")
if [ ${#packages[@]} -eq 0 ]; then
  packages=(tritonclient hpack posix_ipc msgspec orjson starlette uvicorn httptools geventhttpclient gevent
            greenlet zope.event zope.interface brotli python-rapidjson protobuf grpcio)
fi
platforms=()
for tag in manylinux1 manylinux2014 manylinux_2_17 manylinux_2_24 manylinux_2_27 manylinux_2_28 \
           manylinux_2_31 manylinux_2_34 manylinux_2_35; do
  platforms+=(--platform "${tag}_x86_64")
done
mkdir -p .whl
for name in "${packages[@]}"; do
  pinned=$(grep -i -E "^${name//./[.-]}==" constraints.txt || true)
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$version" --implementation cp \
    "${platforms[@]}" -d .whl "${pinned:-$name}"
done
ls .whl
