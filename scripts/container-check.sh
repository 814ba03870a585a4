#!/usr/bin/env bash
# Builds the image of ./Dockerfile with podman and runs the container tests (pytest -m container):
# the image is built, runs unprivileged, answers HTTP and gRPC inference on a mounted model
# repository, passes its own HEALTHCHECK, and stops cleanly on SIGTERM.
#
#   scripts/container-check.sh [pytest args]
#
# Needs podman (apt-get install podman). Where python:3.11-slim cannot be pulled (no registry of
# images), a base image with the same layout (Python and pip on PATH, useradd) is made from Debian's
# packages with debootstrap and tagged localhost/tritonmp-base:python3. In a sandbox that cannot set
# rlimits or delegate cgroups, podman is run with runc, cgroupfs and no default ulimits.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v podman >/dev/null || { echo "container-check: podman is not installed" >&2; exit 1; }
export TRITONMP_CONTAINER_BASE=${TRITONMP_CONTAINER_BASE:-python:3.11-slim}

if ! podman image exists "$TRITONMP_CONTAINER_BASE" && ! podman pull -q "$TRITONMP_CONTAINER_BASE" 2>/dev/null; then
  TRITONMP_CONTAINER_BASE=localhost/tritonmp-base:python3
  if ! podman image exists "$TRITONMP_CONTAINER_BASE"; then
    command -v debootstrap >/dev/null || { echo "container-check: no base image and no debootstrap" >&2; exit 1; }
    root=$(mktemp -d)
    trap 'rm -rf "$root"' EXIT
    debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates,passwd bookworm "$root" \
      http://deb.debian.org/debian >/dev/null
    chroot "$root" python3 -m venv /usr/local/python
    tar -C "$root" -c . | podman import \
      --change 'ENV PATH=/usr/local/python/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
      --change 'CMD ["python3"]' - "$TRITONMP_CONTAINER_BASE" >/dev/null
  fi
fi

if ! podman run --rm --network none "$TRITONMP_CONTAINER_BASE" true 2>/dev/null; then
  conf=$(mktemp)
  printf '[containers]\ndefault_ulimits = []\n[engine]\ncgroup_manager = "cgroupfs"\nruntime = "runc"\n' > "$conf"
  export CONTAINERS_CONF=$conf
  podman run --rm --network none "$TRITONMP_CONTAINER_BASE" true
fi

PYTHON=${PYTHON:-.venv/bin/python}
exec $PYTHON -m pytest -q -m container -rs tests/test_container.py "$@"
