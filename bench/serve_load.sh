#!/usr/bin/env bash
# Serving throughput of the zoo's cnn over HTTP: `afterburner serve` with dynamic batching, then
# without, each loaded by `afterburner loadgen` on the same machine (they share the cores).
#
#   bench/serve_load.sh [BUILD_DIR] [DURATION_SECONDS] [POISSON_RATE] [PRECISION]
#
# PRECISION (fp32, bf16 or int8) first runs `afterburner optimize` on the exported model and
# serves its result; without it the plain export is served (frozen and laid out for oneDNN at
# load, as every served model is).
#
# Prints a closed-loop sweep (1, 8, 64 connections) per server and a Poisson open loop at
# POISSON_RATE requests/s against the batching one. The model's weights come from a short
# training run (served latency does not depend on them).
set -euo pipefail

build=${1:-build}
duration=${2:-10}
rate=${3:-6000}
precision=${4:-}
cli=$build/afterburner
source "$(dirname "$0")/serve_common.sh"

write_cnn_repository "$precision"

echo "== dynamic batching, closed loop"
start_server
"$cli" loadgen --url "$url" --model cnn --concurrency 1,8,64 --duration "$duration"
echo "== dynamic batching, Poisson open loop at $rate req/s, up to 64 connections"
"$cli" loadgen --url "$url" --model cnn --concurrency 64 --duration "$duration" --rate "$rate"
stop_server

echo "== batching off, closed loop"
start_server --no-batching
"$cli" loadgen --url "$url" --model cnn --concurrency 1,64 --duration "$duration"
stop_server
