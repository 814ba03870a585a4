#!/usr/bin/env bash
# Throughput, p99 latency and frontend CPU per request of tritonmp against the real Triton server,
# side by side in one run.
#
#   scripts/bench_vs_triton.sh            (or: make bench)
#
# Installs the reference tools (../shared/anchors/setup.sh), serves the same python-backend add
# model (configs/model_repository/add_py) with tritonmp and with tritonserver-ref, and loads each
# with perf_analyzer over HTTP and gRPC, and with wrk over HTTP (JSON tensors, keep-alive, one
# thread), at each concurrency, alternating servers for ROUNDS rounds. For every row it prints the
# medians (and the spread over rounds) of throughput and p99, their ratios tritonmp / Triton, and
# each server's frontend CPU microseconds per request: the CPU time of its server process (not the
# model's worker or stub) over the measurement, read from /proc, divided by the requests its
# metrics counted meanwhile.
# Environment: ROUNDS (3), CONCURRENCY ("1 16 64"), PROTOCOLS ("http grpc"), CLIENTS
# ("perf_analyzer wrk"), INTERVAL_MS (3000), WRK_SECONDS (5), STABILITY (30: perf_analyzer's
# --stability-percentage; this machine class is noisy), TRITONMP_ARGS (extra tritonmp flags, e.g.
# "--grpc-engine grpcio" to measure grpc.aio instead). wrk is Debian's package: installed when
# missing and run as root, else its rows are skipped with a line saying so. A server that dies
# during a measurement (the reference's python stub has crashed here under load) is started again,
# with the end of its log printed, and only that measurement is lost.
set -euo pipefail
source "$(dirname "$0")/bench_common.sh"
rounds=${ROUNDS:-3}
concurrency=${CONCURRENCY:-"1 16 64"}
protocols=${PROTOCOLS:-"http grpc"}
clients=${CLIENTS:-"perf_analyzer wrk"}
interval=${INTERVAL_MS:-3000}
wrk_seconds=${WRK_SECONDS:-5}
if [[ " $clients " == *" wrk "* ]] && ! command -v wrk >/dev/null; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq wrk >/dev/null 2>&1 \
      || { apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq wrk >/dev/null; } \
      || true
  fi
  command -v wrk >/dev/null || { echo "wrk is not installed (Debian's package wrk): its rows are skipped" >&2
                                 clients=${clients//wrk/}; }
fi
mkdir -p "$work/repo"
cp -r "$root/configs/model_repository/add_py" "$work/repo/"

start_tritonmp() {
  "$py" -m tritonmp --model-repository "$work/repo" --http-port "$mp_http" --grpc-port "$mp_grpc" \
    --metrics-port "$mp_metrics" ${TRITONMP_ARGS:-} >"$work/tritonmp.log" 2>&1 &
  mp_pid=$!
  pids+=($mp_pid)
}
start_triton() {
  "$anchors_dir/bin/tritonserver-ref" --model-repository "$work/repo" --http-port "$ref_http" \
    --grpc-port "$ref_grpc" --metrics-port "$ref_metrics" >"$work/triton.log" 2>&1 &
  ref_pid=$!
  pids+=($ref_pid)
}
alive_or_restarted() {  # server: a server that died during the last measurement is started again
  local pid=$mp_pid
  [ "$1" = triton ] && pid=$ref_pid
  kill -0 "$pid" 2>/dev/null && return 0
  echo "$1 died during a measurement; the row is skipped and it is started again. The end of its log:" >&2
  tail -5 "$work/$1.log" >&2
  if [ "$1" = triton ]; then start_triton; wait_ready "$ref_http" "$work/triton.log"
  else start_tritonmp; wait_ready "$mp_http" "$work/tritonmp.log"; fi
  return 1
}
start_tritonmp
start_triton
wait_ready "$mp_http" "$work/tritonmp.log"
wait_ready "$ref_http" "$work/triton.log"

cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat" 2>/dev/null || echo 0; }
served() {  # successful requests so far, from the server's metrics
  curl -s "localhost:$1/metrics" | awk '/^nv_inference_request_success\{model="add_py"/ {print $2}'
}
cat >"$work/add.lua" <<'LUA'
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.body = '{"inputs":[{"name":"A","shape":[1,3],"datatype":"FP32","data":[1,2,3]},' ..
           '{"name":"B","shape":[1,3],"datatype":"FP32","data":[1,2,3]}]}'
LUA

run_pa() {  # server port protocol concurrency csv
  "$anchors_dir/bin/perf_analyzer" -m add_py -u "localhost:$2" -i "$3" --concurrency-range "$4" \
    --measurement-interval "$interval" --stability-percentage "${STABILITY:-30}" --max-trials 20 \
    -f "$5" >"$5.log" 2>&1 \
    || { echo "perf_analyzer found no stable measurement against $1 ($3, concurrency $4); skipped" >&2
         tail -3 "$5.log" >&2; return 1; }
}

run_wrk() {  # port concurrency out: writes "inf/s<TAB>p99 us" to out
  wrk -t 1 -c "$2" -d "${wrk_seconds}s" --latency -s "$work/add.lua" \
    "http://127.0.0.1:$1/v2/models/add_py/infer" >"$3.log" 2>&1 || return 1
  "$py" - "$3.log" >"$3" <<'PY'
import re, sys
text = open(sys.argv[1]).read()
if "Non-2xx" in text:
    sys.exit(f"wrk: some responses failed:\n{text}")
rps = float(re.search(r"Requests/sec:\s+([\d.]+)", text).group(1))
value, unit = re.search(r"^\s*99%\s+([\d.]+)(us|ms|s)\s*$", text, re.M).groups()
print(rps, float(value) * {"us": 1, "ms": 1e3, "s": 1e6}[unit], sep="\t")
PY
}

results="$work/results.tsv"
for r in $(seq "$rounds"); do
  for proto in $protocols; do
    for client in $clients; do
      [ "$client" = wrk ] && [ "$proto" != http ] && continue
      for c in $concurrency; do
        for server in tritonmp triton; do
          if [ "$server" = tritonmp ]; then pid=$mp_pid; port=$mp_http; metrics=$mp_metrics
          else pid=$ref_pid; port=$ref_http; metrics=$ref_metrics; fi
          if [ "$proto" = grpc ]; then
            if [ "$server" = tritonmp ]; then port=$mp_grpc; else port=$ref_grpc; fi
          fi
          out="$work/$server-$client-$proto-$c-$r"
          ticks0=$(cpu_ticks "$pid"); n0=$(served "$metrics")
          if [ "$client" = wrk ]; then
            run_wrk "$port" "$c" "$out.tsv" \
              || { echo "wrk failed against $server (concurrency $c); skipped" >&2; tail -5 "$out.tsv.log" >&2
                   alive_or_restarted "$server" || true; continue; }
          else
            run_pa "$server" "$port" "$proto" "$c" "$out.csv" || { alive_or_restarted "$server" || true; continue; }
            "$py" - "$out.csv" >"$out.tsv" <<'PY'
import csv, sys
row = next(csv.DictReader(open(sys.argv[1])))
print(row["Inferences/Second"], row["p99 latency"], sep="\t")
PY
          fi
          alive_or_restarted "$server" || continue
          ticks1=$(cpu_ticks "$pid"); n1=$(served "$metrics")
          "$py" - "$out.tsv" "$server" "$client" "$proto" "$c" "$ticks0" "$ticks1" "$n0" "$n1" >>"$results" <<'PY'
import os, sys
path, server, client, proto, conc, t0, t1, n0, n1 = sys.argv[1:]
thr, p99 = open(path).read().split()
cpu_us = (int(t1) - int(t0)) / os.sysconf("SC_CLK_TCK") * 1e6 / max(1.0, float(n1) - float(n0))
print(server, client, proto, conc, thr, p99, f"{cpu_us:.1f}", sep="\t")
PY
        done
      done
    done
  done
  echo "round $r of $rounds done" >&2
done

"$py" - "$results" <<'PY'
import statistics, sys
from collections import defaultdict
runs = defaultdict(list)
for line in open(sys.argv[1]):
    server, client, proto, conc, thr, p99, cpu = line.split("\t")
    runs[(proto, client, int(conc), server)].append((float(thr), float(p99), float(cpu)))

def spread(values):
    m = statistics.median(values)
    return 100 * (max(values) - min(values)) / m if m else 0.0

print(f"{'protocol':8} {'client':13} {'conc':>4} | {'tritonmp/s':>10} {'triton/s':>9} {'ratio':>6} {'spread':>7} | "
      f"{'p99 us mp':>9} {'triton':>8} {'ratio':>6} | {'cpu us/req mp':>13} {'triton':>7}")
for proto, client, conc in sorted({k[:3] for k in runs}):
    mp, ref = runs.get((proto, client, conc, "tritonmp")), runs.get((proto, client, conc, "triton"))
    if not mp or not ref:
        continue
    mt, rt = statistics.median(t for t, _, _ in mp), statistics.median(t for t, _, _ in ref)
    ml, rl = statistics.median(p for _, p, _ in mp), statistics.median(p for _, p, _ in ref)
    mc, rc = statistics.median(c for _, _, c in mp), statistics.median(c for _, _, c in ref)
    worst = max(spread([t for t, _, _ in mp]), spread([t for t, _, _ in ref]))
    print(f"{proto:8} {client:13} {conc:>4} | {mt:>10.0f} {rt:>9.0f} {mt / rt:>6.2f} {worst:>6.0f}% | "
          f"{ml:>9.0f} {rl:>8.0f} {ml / rl:>6.2f} | {mc:>13.1f} {rc:>7.1f}")
print("(medians over rounds; spread: the larger of the two servers' (max - min) / median of throughput;")
print(" throughput ratio > 1 and p99 ratio < 1 favour tritonmp; cpu: the server process only)")
PY
