#!/usr/bin/env bash
# Stateful models: throughput and p99 of tritonmp against the real Triton server, side by side in one
# run, under perf_analyzer's sequence mode.
#
#   scripts/bench_sequences.sh
#
# Serves a python-backend model that keeps a running sum per sequence (max_batch_size 16, one
# instance, controls START, END, READY and CORRID) with each sequence batching strategy, and loads
# each server with perf_analyzer sending SEQUENCES concurrent sequences of SEQUENCE_LENGTH requests,
# alternating servers for ROUNDS rounds. Prints, per strategy and protocol, the medians of
# throughput and p99 and their ratios tritonmp / Triton.
# Environment: ROUNDS (2), STRATEGIES ("direct oldest"), PROTOCOLS ("grpc"), SEQUENCES (64),
# SEQUENCE_LENGTH (20), INTERVAL_MS (5000), STABILITY (30).
set -euo pipefail
source "$(dirname "$0")/bench_common.sh"
rounds=${ROUNDS:-2}
strategies=${STRATEGIES:-"direct oldest"}
protocols=${PROTOCOLS:-"grpc"}
sequences=${SEQUENCES:-64}
length=${SEQUENCE_LENGTH:-20}
interval=${INTERVAL_MS:-5000}

write_model() {  # repo strategy
  mkdir -p "$1/seq_py/1"
  local choice=""
  [ "$2" = oldest ] && choice="oldest { max_candidate_sequences: $sequences preferred_batch_size: [ 16 ] }"
  cat >"$1/seq_py/config.pbtxt" <<CONFIG
name: "seq_py"
backend: "python"
max_batch_size: 16
sequence_batching {
  max_sequence_idle_microseconds: 5000000
  $choice
  control_input [
    { name: "START", control [ { kind: CONTROL_SEQUENCE_START, int32_false_true: [ 0, 1 ] } ] },
    { name: "END", control [ { kind: CONTROL_SEQUENCE_END, int32_false_true: [ 0, 1 ] } ] },
    { name: "READY", control [ { kind: CONTROL_SEQUENCE_READY, int32_false_true: [ 0, 1 ] } ] },
    { name: "CORRID", control [ { kind: CONTROL_SEQUENCE_CORRID, data_type: TYPE_UINT64 } ] }
  ]
}
input [ { name: "INPUT", data_type: TYPE_INT32, dims: [ 1 ] } ]
output [ { name: "OUTPUT", data_type: TYPE_INT32, dims: [ 1 ] } ]
instance_group [ { count: 1, kind: KIND_CPU } ]
CONFIG
  cat >"$1/seq_py/1/model.py" <<'MODEL'
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.sums = {}

    def execute(self, requests):
        responses = []
        for request in requests:
            def scalar(name):
                return int(pb_utils.get_input_tensor_by_name(request, name).as_numpy().flat[0])
            total = 0
            if scalar("READY"):
                corrid = scalar("CORRID")
                total = ((0 if scalar("START") else self.sums.get(corrid, 0)) + scalar("INPUT")) % 1000003
                if scalar("END"):
                    self.sums.pop(corrid, None)
                else:
                    self.sums[corrid] = total
            responses.append(pb_utils.InferenceResponse(
                [pb_utils.Tensor("OUTPUT", np.array([[total]], np.int32))]))
        return responses
MODEL
}

start() {  # strategy: both servers on a repository of that strategy
  rm -rf "$work/repo" && mkdir -p "$work/repo" && write_model "$work/repo" "$1"
  start_servers "$work/repo"
}

results="$work/results.tsv"
for strategy in $strategies; do
  start "$strategy"
  for r in $(seq "$rounds"); do
    for proto in $protocols; do
      for server in tritonmp triton; do
        port=$mp_grpc; [ "$server" = triton ] && port=$ref_grpc
        if [ "$proto" = http ]; then port=$mp_http; [ "$server" = triton ] && port=$ref_http; fi
        out="$work/$strategy-$server-$proto-$r.csv"
        "$anchors_dir/bin/perf_analyzer" -m seq_py -u "localhost:$port" -i "$proto" \
          --concurrency-range "$sequences" --sequence-length "$length" --sequence-id-range 1:1000000000 \
          --measurement-interval "$interval" --stability-percentage "${STABILITY:-30}" --max-trials 20 \
          -f "$out" >"$out.log" 2>&1 \
          || { echo "perf_analyzer found no stable measurement against $server ($strategy, $proto); skipped" >&2
               tail -3 "$out.log" >&2; continue; }
        "$py" - "$out" "$strategy" "$server" "$proto" >>"$results" <<'PY'
import csv, sys
path, strategy, server, proto = sys.argv[1:]
row = next(csv.DictReader(open(path)))
print(strategy, server, proto, row["Inferences/Second"], row["p99 latency"], sep="\t")
PY
      done
    done
  done
  stop_servers
done

"$py" - "$results" "$sequences" "$length" <<'PY'
import statistics, sys
from collections import defaultdict
runs = defaultdict(list)
for line in open(sys.argv[1]):
    strategy, server, proto, thr, p99 = line.split("\t")
    runs[(strategy, proto, server)].append((float(thr), float(p99)))
print(f"{sys.argv[2]} concurrent sequences of {sys.argv[3]} requests, python model, max_batch_size 16, one instance")
print(f"{'strategy':8} {'protocol':8} | {'tritonmp/s':>10} {'triton/s':>9} {'ratio':>6} | "
      f"{'p99 us mp':>9} {'triton':>8} {'ratio':>6}")
for strategy, proto in sorted({k[:2] for k in runs}):
    mp, ref = runs.get((strategy, proto, "tritonmp")), runs.get((strategy, proto, "triton"))
    if not mp or not ref:
        continue
    mt, rt = statistics.median(t for t, _ in mp), statistics.median(t for t, _ in ref)
    ml, rl = statistics.median(p for _, p in mp), statistics.median(p for _, p in ref)
    print(f"{strategy:8} {proto:8} | {mt:>10.0f} {rt:>9.0f} {mt / rt:>6.2f} | {ml:>9.0f} {rl:>8.0f} {ml / rl:>6.2f}")
print("(medians over rounds; throughput ratio > 1 and p99 ratio < 1 favour tritonmp)")
PY
