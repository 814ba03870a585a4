# Sourced by the benchmarks that compare tritonmp with the reference Triton server: installs the
# reference tools, makes a work directory that goes on exit (with the servers started there),
# picks six free ports.
#   sets: root anchors_dir py work pids mp_http mp_grpc mp_metrics ref_http ref_grpc ref_metrics;
#   defines wait_ready, start_servers, stop_servers, perf_round, summarize_results and write_identity_model.
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

perf_round() {  # model mode server protocol [perf_analyzer args...]: one measurement, appended to $work/results.tsv
  local model=$1 mode=$2 server=$3 proto=$4; shift 4
  local port=$mp_grpc
  [ "$server" = triton ] && port=$ref_grpc
  [ "$proto" = http ] && { port=$mp_http; [ "$server" = triton ] && port=$ref_http; }
  local out="$work/$mode-$server-$proto-$RANDOM.csv"
  "$anchors_dir/bin/perf_analyzer" -m "$model" -u "localhost:$port" -i "$proto" -f "$out" "$@" >"$out.log" 2>&1 \
    || { echo "perf_analyzer found no stable measurement against $server ($mode); skipped" >&2
         tail -3 "$out.log" >&2; return 0; }
  "$py" - "$out" "$mode" "$server" >>"$work/results.tsv" <<'PY'
import csv, sys
path, mode, server = sys.argv[1:]
row = next(csv.DictReader(open(path)))
print(mode, server, row["Inferences/Second"], row["p99 latency"], sep="\t")
PY
}

summarize_results() {  # title column-name modes...: medians per mode and server of $work/results.tsv, and their ratios
  "$py" - "$work/results.tsv" "$@" <<'PY'
import statistics, sys
from collections import defaultdict
path, title, column, *modes = sys.argv[1:]
runs = defaultdict(list)
for line in open(path):
    mode, server, thr, p99 = line.split("\t")
    runs[(mode, server)].append((float(thr), float(p99)))
print(title)
print(f"{column:22} | {'tritonmp/s':>10} {'triton/s':>9} {'ratio':>6} | {'p99 us mp':>9} {'triton':>8} {'ratio':>6}")
for mode in modes:
    mp, ref = runs.get((mode, "tritonmp")), runs.get((mode, "triton"))
    if not mp and not ref:
        continue
    mt, ml = (statistics.median(t for t, _ in mp), statistics.median(p for _, p in mp)) if mp else (0.0, 0.0)
    rt, rl = (statistics.median(t for t, _ in ref), statistics.median(p for _, p in ref)) if ref else (0.0, 0.0)
    ratio = f"{mt / rt:>6.2f}" if mt and rt else f"{'-':>6}"
    p99_ratio = f"{ml / rl:>6.2f}" if ml and rl else f"{'-':>6}"
    print(f"{mode:22} | {mt:>10.0f} {rt:>9.0f} {ratio} | {ml:>9.0f} {rl:>8.0f} {p99_ratio}")
print("(medians over rounds; 0 where a server gave no measurement; throughput ratio > 1 and p99 ratio < 1 "
      "favour tritonmp)")
PY
}

write_identity_model() {  # name instance_group: a python identity model (FP32 [16], max_batch_size 8,
  # dynamic batching) in $work/repo, with that instance_group line
  mkdir -p "$work/repo/$1/1"
  cat >"$work/repo/$1/config.pbtxt" <<CONFIG
name: "$1"
backend: "python"
max_batch_size: 8
dynamic_batching { }
input [ { name: "INPUT0", data_type: TYPE_FP32, dims: [ 16 ] } ]
output [ { name: "OUTPUT0", data_type: TYPE_FP32, dims: [ 16 ] } ]
$2
CONFIG
  cat >"$work/repo/$1/1/model.py" <<'MODEL'
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse(
            [pb_utils.Tensor("OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy())])
            for r in requests]
MODEL
}
