#!/usr/bin/env bash
# Large tensors through every data path, tritonmp against the real Triton server in one run.
#
#   scripts/bench_large.sh
#
# Serves a python-backend model C = A + B over FP32 [-1] inputs (add_large) with tritonmp and with
# tritonserver-ref, and runs perf_analyzer against each over gRPC, HTTP (binary tensors) and system
# shared memory (inputs and outputs), at 4 MiB and 64 MiB per tensor, concurrency 1 and 4,
# alternating the servers for ROUNDS rounds. For each row: both servers' throughput and p99, the
# ratios, and the frontend's CPU milliseconds per request (the server process's utime + stime over
# the run, from /proc, divided by the requests it served, from its metrics). Also prints the floor:
# one numpy copy of the request's bytes (A, B and C).
# Environment: ROUNDS (3), SIZES_MIB ("4 64"), CONCURRENCY ("1 4"), PATHS ("grpc http shm"),
# INTERVAL_MS (4000), STABILITY (30), TRITONMP_ARGS.
set -euo pipefail
source "$(dirname "$0")/bench_common.sh"
rounds=${ROUNDS:-3}
sizes=${SIZES_MIB:-"4 64"}
concurrency=${CONCURRENCY:-"1 4"}
paths=${PATHS:-"grpc http shm"}
interval=${INTERVAL_MS:-4000}
mkdir -p "$work/repo/add_large/1"
cat >"$work/repo/add_large/config.pbtxt" <<'EOF'
name: "add_large"
backend: "python"
max_batch_size: 0
input [ { name: "A", data_type: TYPE_FP32, dims: [ -1 ] }, { name: "B", data_type: TYPE_FP32, dims: [ -1 ] } ]
output [ { name: "C", data_type: TYPE_FP32, dims: [ -1 ] } ]
instance_group [ { kind: KIND_CPU, count: 1 } ]
EOF
cat >"$work/repo/add_large/1/model.py" <<'EOF'
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            a = pb_utils.get_input_tensor_by_name(r, "A").as_numpy()
            b = pb_utils.get_input_tensor_by_name(r, "B").as_numpy()
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("C", np.add(a, b))]))
        return out
EOF


"$py" -m tritonmp --model-repository "$work/repo" --http-port "$mp_http" --grpc-port "$mp_grpc" \
  --metrics-port "$mp_metrics" --allow-client-shm=true --http-max-input-size $((512 << 20)) \
  ${TRITONMP_ARGS:-} >"$work/tritonmp.log" 2>&1 &
mp_pid=$!
pids+=($mp_pid)
"$anchors_dir/bin/tritonserver-ref" --model-repository "$work/repo" --http-port "$ref_http" \
  --grpc-port "$ref_grpc" --metrics-port "$ref_metrics" >"$work/triton.log" 2>&1 &
ref_pid=$!
pids+=($ref_pid)
wait_ready "$mp_http" "$work/tritonmp.log"
wait_ready "$ref_http" "$work/triton.log"

cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
served() {  # successful requests so far, from the server's metrics
  curl -s "localhost:$1/metrics" | awk '/^nv_inference_request_success\{model="add_large"/ {print $2}'
}

results="$work/results.tsv"
for r in $(seq "$rounds"); do
  for mib in $sizes; do
    elems=$((mib * 262144))
    for path in $paths; do
      for c in $concurrency; do
        for server in tritonmp triton; do
          if [ "$server" = tritonmp ]; then pid=$mp_pid; http=$mp_http; grpc=$mp_grpc; metrics=$mp_metrics
          else pid=$ref_pid; http=$ref_http; grpc=$ref_grpc; metrics=$ref_metrics; fi
          args=(-m add_large --shape "A:$elems" --shape "B:$elems" --concurrency-range "$c"
                --measurement-interval "$interval" --stability-percentage "${STABILITY:-30}" --max-trials 10)
          case $path in
            grpc) args+=(-i grpc -u "localhost:$grpc") ;;
            http) args+=(-i http -u "localhost:$http") ;;
            shm) args+=(-i grpc -u "localhost:$grpc" --shared-memory system
                        --output-shared-memory-size $((mib << 20))) ;;
          esac
          csv="$work/$server-$path-$mib-$c-$r.csv"
          ticks0=$(cpu_ticks "$pid"); n0=$(served "$metrics")
          if ! "$anchors_dir/bin/perf_analyzer" "${args[@]}" -f "$csv" >"$csv.log" 2>&1; then
            echo "perf_analyzer found no stable measurement against $server ($path, $mib MiB, concurrency $c); skipped" >&2
            tail -3 "$csv.log" >&2
            continue
          fi
          ticks1=$(cpu_ticks "$pid"); n1=$(served "$metrics")
          "$py" - "$csv" "$server" "$path" "$mib" "$c" "$ticks0" "$ticks1" "$n0" "$n1" >>"$results" <<'PY'
import csv, os, sys
path, server, proto, mib, conc, t0, t1, n0, n1 = sys.argv[1:]
row = next(csv.DictReader(open(path)))
requests = max(1.0, float(n1) - float(n0))
cpu_ms = (int(t1) - int(t0)) / os.sysconf("SC_CLK_TCK") * 1000 / requests
print(server, proto, mib, conc, row["Inferences/Second"], row["p99 latency"], f"{cpu_ms:.2f}", sep="\t")
PY
        done
      done
    done
  done
  echo "round $r of $rounds done" >&2
done

"$py" - "$results" "$sizes" <<'PY'
import statistics, sys, time
from collections import defaultdict

import numpy as np

runs = defaultdict(list)
for line in open(sys.argv[1]):
    server, path, mib, conc, thr, p99, cpu = line.split("\t")
    runs[(int(mib), path, int(conc), server)].append((float(thr), float(p99), float(cpu)))
print(f"{'MiB':>3} {'path':5} {'c':>2} | {'tritonmp/s':>10} {'triton/s':>9} {'ratio':>6} | {'p99 ms mp':>9} "
      f"{'triton':>8} {'ratio':>6} | {'CPU ms/req mp':>13} {'triton':>7}")
for mib, path, conc in sorted({k[:3] for k in runs}):
    mp, ref = runs.get((mib, path, conc, "tritonmp")), runs.get((mib, path, conc, "triton"))
    if not mp or not ref:
        continue
    med = lambda rows, i: statistics.median(r[i] for r in rows)  # noqa: E731
    spread = lambda rows: (max(r[0] for r in rows) - min(r[0] for r in rows)) / med(rows, 0) if len(rows) > 1 else 0
    print(f"{mib:>3} {path:5} {conc:>2} | {med(mp, 0):>10.1f} {med(ref, 0):>9.1f} {med(mp, 0) / med(ref, 0):>6.2f} | "
          f"{med(mp, 1) / 1000:>9.1f} {med(ref, 1) / 1000:>8.1f} {med(mp, 1) / med(ref, 1):>6.2f} | "
          f"{med(mp, 2):>13.2f} {med(ref, 2):>7.2f}   (spread {spread(mp):.0%} / {spread(ref):.0%})")
for mib in map(int, sys.argv[2].split()):
    src = np.ones(3 * mib * 262144, np.float32)
    dst = np.empty_like(src)
    times = []
    for _ in range(10):
        t = time.perf_counter()
        np.copyto(dst, src)
        times.append(time.perf_counter() - t)
    print(f"floor: one copy of a {mib} MiB request's bytes (A, B and C: {3 * mib} MiB) takes "
          f"{statistics.median(times) * 1000:.1f} ms")
print("(medians over rounds; throughput ratio > 1 and p99 ratio < 1 favour tritonmp; CPU ms per request: "
      "the server process only, tritonmp's frontend or Triton's whole server)")
PY
