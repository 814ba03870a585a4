#!/usr/bin/env bash
# The rate limiter's cost: throughput and p99 of tritonmp against the real Triton server, side by side
# in one run, with --rate-limit off and --rate-limit=execution_count, under perf_analyzer.
#
#   scripts/bench_rate_limiter.sh
#
# Serves a python-backend identity model (FP32 [16], max_batch_size 8, dynamic batching, two CPU
# instances whose instance group asks for one "R" each, priority 1) and loads each server with
# perf_analyzer at CONCURRENCY requests over gRPC, alternating servers for ROUNDS rounds: with the
# limiter off, and on with R:2 (both instances may run, so the limiter's bookkeeping is the only
# difference). Prints, per mode, the medians of throughput and p99 and their ratios tritonmp / Triton.
# Environment: ROUNDS (2), CONCURRENCY (16), INTERVAL_MS (5000), STABILITY (30).
set -euo pipefail
source "$(dirname "$0")/bench_common.sh"
rounds=${ROUNDS:-2}
concurrency=${CONCURRENCY:-16}
interval=${INTERVAL_MS:-5000}

mkdir -p "$work/repo/identity_rl/1"
cat >"$work/repo/identity_rl/config.pbtxt" <<'CONFIG'
name: "identity_rl"
backend: "python"
max_batch_size: 8
dynamic_batching { }
input [ { name: "INPUT0", data_type: TYPE_FP32, dims: [ 16 ] } ]
output [ { name: "OUTPUT0", data_type: TYPE_FP32, dims: [ 16 ] } ]
instance_group [ { count: 2, kind: KIND_CPU, rate_limiter { resources [ { name: "R", count: 1 } ] } } ]
CONFIG
cat >"$work/repo/identity_rl/1/model.py" <<'MODEL'
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse(
            [pb_utils.Tensor("OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy())])
            for r in requests]
MODEL

results="$work/results.tsv"
for mode in off execution_count; do
  if [ "$mode" = off ]; then start_servers "$work/repo" --rate-limit=off
  else start_servers "$work/repo" --rate-limit=execution_count --rate-limit-resource=R:2; fi
  for r in $(seq "$rounds"); do
    for server in tritonmp triton; do
      port=$mp_grpc; [ "$server" = triton ] && port=$ref_grpc
      out="$work/$mode-$server-$r.csv"
      "$anchors_dir/bin/perf_analyzer" -m identity_rl -u "localhost:$port" -i grpc \
        --concurrency-range "$concurrency" --measurement-interval "$interval" \
        --stability-percentage "${STABILITY:-30}" --max-trials 20 -f "$out" >"$out.log" 2>&1 \
        || { echo "perf_analyzer found no stable measurement against $server ($mode); skipped" >&2
             tail -3 "$out.log" >&2; continue; }
      "$py" - "$out" "$mode" "$server" >>"$results" <<'PY'
import csv, sys
path, mode, server = sys.argv[1:]
row = next(csv.DictReader(open(path)))
print(mode, server, row["Inferences/Second"], row["p99 latency"], sep="\t")
PY
    done
  done
  stop_servers
done

"$py" - "$results" "$concurrency" <<'PY'
import statistics, sys
from collections import defaultdict
runs = defaultdict(list)
for line in open(sys.argv[1]):
    mode, server, thr, p99 = line.split("\t")
    runs[(mode, server)].append((float(thr), float(p99)))
print(f"python identity model, two instances, {sys.argv[2]} concurrent gRPC requests")
print(f"{'--rate-limit':16} | {'tritonmp/s':>10} {'triton/s':>9} {'ratio':>6} | {'p99 us mp':>9} {'triton':>8} {'ratio':>6}")
for mode in ("off", "execution_count"):
    mp, ref = runs.get((mode, "tritonmp")), runs.get((mode, "triton"))
    if not mp or not ref:
        continue
    mt, rt = statistics.median(t for t, _ in mp), statistics.median(t for t, _ in ref)
    ml, rl = statistics.median(p for _, p in mp), statistics.median(p for _, p in ref)
    print(f"{mode:16} | {mt:>10.0f} {rt:>9.0f} {mt / rt:>6.2f} | {ml:>9.0f} {rl:>8.0f} {ml / rl:>6.2f}")
print("(medians over rounds; throughput ratio > 1 and p99 ratio < 1 favour tritonmp)")
PY
