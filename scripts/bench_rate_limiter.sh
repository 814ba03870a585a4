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

write_identity_model identity_rl 'instance_group [ { count: 2, kind: KIND_CPU, rate_limiter { resources [ { name: "R", count: 1 } ] } } ]'

for mode in off execution_count; do
  if [ "$mode" = off ]; then start_servers "$work/repo" --rate-limit=off
  else start_servers "$work/repo" --rate-limit=execution_count --rate-limit-resource=R:2; fi
  for r in $(seq "$rounds"); do
    for server in tritonmp triton; do
      perf_round identity_rl "$mode" "$server" grpc --concurrency-range "$concurrency" \
        --measurement-interval "$interval" --stability-percentage "${STABILITY:-30}" --max-trials 20
    done
  done
  stop_servers
done
summarize_results "python identity model, two instances, $concurrency concurrent gRPC requests" --rate-limit \
  off execution_count
