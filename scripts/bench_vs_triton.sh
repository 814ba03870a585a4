#!/usr/bin/env bash
# Throughput and p99 latency of tritonmp against the real Triton server, side by side in one run.
#
#   scripts/bench_vs_triton.sh            (or: make bench)
#
# Installs the reference tools (../shared/anchors/setup.sh), serves the same python-backend add
# model (configs/model_repository/add_py) with tritonmp and with tritonserver-ref, and runs
# perf_analyzer against each over HTTP and gRPC, at each concurrency,
# alternating servers for ROUNDS rounds. Prints the medians and the ratio tritonmp / Triton.
# Environment: ROUNDS (3), CONCURRENCY ("1 8 32"), PROTOCOLS ("http grpc"), INTERVAL_MS (3000),
# STABILITY (30: perf_analyzer's --stability-percentage; this machine class is noisy),
# TRITONMP_ARGS (extra tritonmp flags, e.g. "--grpc-engine grpcio" to measure grpc.aio instead).
set -euo pipefail
source "$(dirname "$0")/bench_common.sh"
rounds=${ROUNDS:-3}
concurrency=${CONCURRENCY:-"1 8 32"}
protocols=${PROTOCOLS:-"http grpc"}
interval=${INTERVAL_MS:-3000}
mkdir -p "$work/repo"
cp -r "$root/configs/model_repository/add_py" "$work/repo/"

"$py" -m tritonmp --model-repository "$work/repo" --http-port "$mp_http" --grpc-port "$mp_grpc" \
  --metrics-port "$mp_metrics" ${TRITONMP_ARGS:-} >"$work/tritonmp.log" 2>&1 &
pids+=($!)
"$anchors_dir/bin/tritonserver-ref" --model-repository "$work/repo" --http-port "$ref_http" \
  --grpc-port "$ref_grpc" --metrics-port "$ref_metrics" >"$work/triton.log" 2>&1 &
pids+=($!)
wait_ready "$mp_http" "$work/tritonmp.log"
wait_ready "$ref_http" "$work/triton.log"

run_pa() {  # server port protocol concurrency csv
  "$anchors_dir/bin/perf_analyzer" -m add_py -u "localhost:$2" -i "$3" --concurrency-range "$4" \
    --measurement-interval "$interval" --stability-percentage "${STABILITY:-30}" --max-trials 20 \
    -f "$5" >"$5.log" 2>&1 \
    || { echo "perf_analyzer found no stable measurement against $1 ($3, concurrency $4); skipped" >&2
         tail -3 "$5.log" >&2; return 1; }
}

results="$work/results.tsv"
for r in $(seq "$rounds"); do
  for proto in $protocols; do
    for c in $concurrency; do
      for server in tritonmp triton; do
        if [ "$server" = tritonmp ]; then port=$mp_http; else port=$ref_http; fi
        if [ "$proto" = grpc ]; then
          if [ "$server" = tritonmp ]; then port=$mp_grpc; else port=$ref_grpc; fi
        fi
        csv="$work/$server-$proto-$c-$r.csv"
        run_pa "$server" "$port" "$proto" "$c" "$csv" || continue
        "$py" - "$csv" "$server" "$proto" "$c" >>"$results" <<'PY'
import csv, sys
path, server, proto, conc = sys.argv[1:]
row = next(csv.DictReader(open(path)))
print(server, proto, conc, row["Inferences/Second"], row["p99 latency"], sep="\t")
PY
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
    server, proto, conc, thr, p99 = line.split("\t")
    runs[(proto, int(conc), server)].append((float(thr), float(p99)))
print(f"{'protocol':8} {'conc':>4} | {'tritonmp inf/s':>14} {'triton inf/s':>12} {'ratio':>6} | "
      f"{'tritonmp p99 us':>15} {'triton p99 us':>13} {'ratio':>6}")
for proto, conc in sorted({(p, c) for p, c, _ in runs}):
    mp, ref = runs.get((proto, conc, "tritonmp")), runs.get((proto, conc, "triton"))
    if not mp or not ref:
        continue
    mt, rt = statistics.median(t for t, _ in mp), statistics.median(t for t, _ in ref)
    ml, rl = statistics.median(p for _, p in mp), statistics.median(p for _, p in ref)
    print(f"{proto:8} {conc:>4} | {mt:>14.0f} {rt:>12.0f} {mt / rt:>6.2f} | {ml:>15.0f} {rl:>13.0f} {ml / rl:>6.2f}")
print("(medians over rounds; throughput ratio > 1 and p99 ratio < 1 favour tritonmp)")
PY
