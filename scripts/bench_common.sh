# Sourced by the benchmarks that compare tritonmp with the reference Triton server: installs the
# reference tools, makes a work directory that goes on exit (with the servers started there),
# picks six free ports.
#   sets: root anchors_dir py work pids mp_http mp_grpc mp_metrics ref_http ref_grpc ref_metrics;
#   defines wait_ready, start_servers and stop_servers.
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
anchors_dir=${ANCHORS_DIR:-$HOME/.cache/tritonmp-anchors}
setup=${ANCHORS_SETUP:-$root/../shared/anchors/setup.sh}
py=${PYTHON:-$root/.venv/bin/python}

bash "$setup" "$anchors_dir" >/dev/null
work=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT

# six distinct free ports, all held while they are chosen
read -r mp_http mp_grpc mp_metrics ref_http ref_grpc ref_metrics < <("$py" -c '
import socket
ss = [socket.socket() for _ in range(6)]
for s in ss:
    s.bind(("127.0.0.1", 0))
print(*[s.getsockname()[1] for s in ss])')

wait_ready() {  # port log
  for _ in $(seq 600); do
    curl -sf "localhost:$1/v2/health/ready" >/dev/null && return 0
    sleep 0.1
  done
  echo "server on port $1 did not become ready; its log:" >&2; cat "$2" >&2; exit 1
}

start_servers() {  # repo [server flags...]: tritonmp and the reference on it, ready; sets mp_pid ref_pid
  local repo=$1; shift
  "$py" -m tritonmp --model-repository "$repo" --http-port "$mp_http" --grpc-port "$mp_grpc" \
    --metrics-port "$mp_metrics" "$@" >"$work/tritonmp.log" 2>&1 &
  mp_pid=$!; pids+=($mp_pid)
  "$anchors_dir/bin/tritonserver-ref" --model-repository "$repo" --http-port "$ref_http" \
    --grpc-port "$ref_grpc" --metrics-port "$ref_metrics" "$@" >"$work/triton.log" 2>&1 &
  ref_pid=$!; pids+=($ref_pid)
  wait_ready "$mp_http" "$work/tritonmp.log"
  wait_ready "$ref_http" "$work/triton.log"
}
stop_servers() {
  kill "$mp_pid" "$ref_pid" 2>/dev/null || true
  wait "$mp_pid" "$ref_pid" 2>/dev/null || true
}
