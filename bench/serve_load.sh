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
work=$(mktemp -d)
server_pid=
cleanup() {
  if [[ -n $server_pid ]]; then kill "$server_pid" 2>/dev/null || true; wait "$server_pid" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT

mkdir -p "$work/models/cnn"
"$cli" train --model cnn --max-steps 20 --epochs 1 --progress none --export "$work/cnn.pt" >/dev/null
if [[ -n $precision ]]; then
  "$cli" optimize "$work/cnn.pt" -o "$work/models/cnn/model.pt" --precision "$precision" --force \
    --measure-seconds 0 >/dev/null
else
  cp "$work/cnn.pt" "$work/models/cnn/model.pt"
fi
cat > "$work/models/cnn/config.toml" <<'TOML'
max_batch_size = 64
max_queue_delay_us = 2000
preferred_batch_sizes = [16, 32, 64]
instances = 1
[[input]]
name = "input"
datatype = "FP32"
dims = [1, 28, 28]
[[output]]
name = "output"
datatype = "FP32"
dims = [10]
TOML

# start_server FLAGS...: sets server_pid and url once the server listens.
start_server() {
  "$cli" serve --repo "$work/models" --port 0 "$@" >"$work/serve.log" 2>&1 &
  server_pid=$!
  for _ in $(seq 600); do
    url=$(grep -o 'http://127.0.0.1:[0-9]*' "$work/serve.log" || true)
    [[ -n $url ]] && return
    kill -0 "$server_pid" 2>/dev/null || { cat "$work/serve.log"; exit 1; }
    sleep 0.1
  done
  echo "server did not start"; exit 1
}

stop_server() {
  kill -TERM "$server_pid"
  wait "$server_pid"
  server_pid=
}

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
