#!/usr/bin/env bash
# OpenTelemetry tracing's cost: throughput and p99 of tritonmp against the real Triton server, side by
# side in one run, with tracing off and with --trace-config mode=opentelemetry at a 100% sampling rate
# (every request's spans exported over OTLP/HTTP to a local receiver that answers at once).
#
#   scripts/bench_tracing.sh
#
# Serves a python-backend identity model (FP32 [16], max_batch_size 8, dynamic batching, one CPU
# instance) and loads each server with perf_analyzer at CONCURRENCY requests over gRPC, alternating
# servers for ROUNDS rounds. Prints, per mode, the medians of throughput and p99 and their ratios
# tritonmp / Triton, and how many spans each server's export delivered and dropped.
# Environment: ROUNDS (2), CONCURRENCY (16), INTERVAL_MS (5000), STABILITY (30).
set -euo pipefail
source "$(dirname "$0")/bench_common.sh"
rounds=${ROUNDS:-2}
concurrency=${CONCURRENCY:-16}
interval=${INTERVAL_MS:-5000}

write_identity_model identity_tr 'instance_group [ { count: 1, kind: KIND_CPU } ]'

# the receiver: takes each export (protobuf from tritonmp, JSON from Triton) and answers 200 at once
sink_port=$("$py" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
"$py" - "$sink_port" "$work/sink.count" <<'PY' &
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
count = {"bytes": 0, "posts": 0}
class Sink(BaseHTTPRequestHandler):
    def do_POST(self):
        count["bytes"] += len(self.rfile.read(int(self.headers.get("Content-Length", "0"))))
        count["posts"] += 1
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()
        open(sys.argv[2], "w").write(f"{count['posts']} exports, {count['bytes']} bytes\n")
    def log_message(self, *args):
        pass
ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Sink).serve_forever()
PY
pids+=($!)

for mode in off opentelemetry; do
  if [ "$mode" = off ]; then start_servers "$work/repo"
  else start_servers "$work/repo" --trace-config=mode=opentelemetry --trace-config=level=TIMESTAMPS \
      --trace-config=rate=1 "--trace-config=opentelemetry,url=127.0.0.1:$sink_port/v1/traces"
  fi
  for r in $(seq "$rounds"); do
    for server in tritonmp triton; do
      perf_round identity_tr "$mode" "$server" grpc --concurrency-range "$concurrency" \
        --measurement-interval "$interval" --stability-percentage "${STABILITY:-30}" --max-trials 20
    done
  done
  if [ "$mode" = opentelemetry ]; then
    echo "tritonmp spans dropped: $(curl -s "localhost:$mp_metrics/metrics" | grep '^tritonmp_trace_spans_dropped_total' | cut -d' ' -f2)"
    echo "receiver: $(cat "$work/sink.count" 2>/dev/null || echo 'no export')"
  fi
  grep -m3 -i "abort\|signal\|error" "$work/triton.log" >&2 || true
  stop_servers
done
summarize_results "python identity model, one instance, $concurrency concurrent gRPC requests" "tracing" \
  off opentelemetry
