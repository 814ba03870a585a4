#!/usr/bin/env bash
# Runs Triton's Python example clients (src/python/examples of Triton's client repository, a checkout
# of which is the one argument) unchanged against tritonmp, on the repository of models they expect
# (scripts/example_clients/models: our own models that answer as Triton's qa models do). Serves on
# localhost:8000 and :8001, the clients' defaults, which must be free. Skips what needs a GPU
# (cudashm) or image models and files (image, ensemble_image, grpc_client).
# Usage: scripts/example_clients/check.sh CLIENT_REPO
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
examples=$(cd "$1/src/python/examples" && pwd) || { echo "usage: $0 CLIENT_REPO" >&2; exit 2; }
py="$root/.venv/bin/python"
work=$(mktemp -d)
trap 'kill $server 2>/dev/null; wait 2>/dev/null; rm -rf "$work"' EXIT

# the eight models simple_grpc_model_control.py counts, and the string sequence model apart
cp -r "$here/models" "$work/repo" && cp -r "$here/extra" "$work/extra"
for m in simple_int8 simple_string; do mkdir -p "$work/repo/$m/1" && cp "$here/addsub.py" "$work/repo/$m/1/model.py"; done
for m in simple_identity custom_identity_int32; do mkdir -p "$work/repo/$m/1" && cp "$here/identity.py" "$work/repo/$m/1/model.py"; done
mkdir -p "$work/repo/simple/1" && "$py" "$here/make_simple.py" "$work/repo/simple/1/model.onnx"
# simple_http_model_control.py counts seven
cp -r "$work/repo" "$work/seven" && rm -r "$work/seven/custom_identity_int32"

serve() {
  "$root/.venv/bin/tritonmp" --model-control-mode=explicit --load-model='*' "$@" > "$work/server.log" 2>&1 &
  server=$!
  for _ in $(seq 120); do
    [ "$(curl -s -o /dev/null -w '%{http_code}' localhost:8000/v2/health/ready)" = 200 ] && return
    sleep 0.5
  done
  echo "tritonmp did not become ready:" >&2; cat "$work/server.log" >&2; exit 1
}
stop() { kill "$server"; wait "$server"; }

passed=0; failed=()
run() {
  if (cd "$examples" && timeout 120 "$py" "$@" > "$work/client.log" 2>&1); then passed=$((passed + 1))
  else failed+=("$*"); echo "--- $* failed:"; tail -5 "$work/client.log"; fi
}

serve --model-repository "$work/repo" --model-repository "$work/extra" --allow-client-shm=true
for f in $(cd "$examples" && ls *.py | grep -v -E "model_control|image|^grpc_client.py|cudashm"); do run "$f"; done
for f in simple_grpc_sequence_sync_infer_client.py simple_http_sequence_sync_infer_client.py \
         simple_grpc_sequence_stream_infer_client.py; do run "$f" --dyna -o 7; done
stop
serve --model-repository "$work/repo"
run simple_grpc_model_control.py
stop
serve --model-repository "$work/seven"
run simple_http_model_control.py
stop
echo "${passed} passed, ${#failed[@]} failed"
[ ${#failed[@]} -eq 0 ]
