#!/usr/bin/env bash
# Overload: `afterburner serve` (the zoo's cnn, max_queue_size 128) under wrk at 64 and 1,000
# connections of single-sample JSON requests, for each --io-threads given; prints wrk's summary
# (requests/s, latency percentiles of every answer, non-2xx answers = the 503s of a full queue,
# socket errors and timeouts) and the server's peak resident memory.
#
#   bench/serve_overload.sh [BUILD_DIR] [DURATION_SECONDS] [IO_THREADS...]
set -euo pipefail

build=${1:-build}
duration=${2:-15}
shift $(( $# >= 2 ? 2 : $# ))
io_threads=("${@:-1}")
cli=$build/afterburner
work=$(mktemp -d)
server_pid=
cleanup() {
  if [[ -n $server_pid ]]; then kill "$server_pid" 2>/dev/null || true; wait "$server_pid" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT

mkdir -p "$work/models/cnn"
"$cli" train --model cnn --max-steps 20 --epochs 1 --progress none --export "$work/models/cnn/model.pt" >/dev/null
cat > "$work/models/cnn/config.toml" <<'TOML'
max_batch_size = 64
max_queue_delay_us = 2000
preferred_batch_sizes = [16, 32, 64]
max_queue_size = 128
[[input]]
name = "input"
datatype = "FP32"
dims = [1, 28, 28]
[[output]]
name = "output"
datatype = "FP32"
dims = [10]
TOML
/usr/bin/python3 -c '
import json, sys
json.dump({"inputs": [{"name": "input", "shape": [1, 1, 28, 28], "datatype": "FP32", "data": [0.1] * 784}]},
          open(sys.argv[1], "w"))' "$work/body.json"
cat > "$work/post.lua" <<LUA
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
local file = io.open("$work/body.json", "r")
wrk.body = file:read("*a")
file:close()
LUA

for threads in "${io_threads[@]}"; do
  "$cli" serve --repo "$work/models" --port 0 --io-threads "$threads" >"$work/serve.log" 2>&1 &
  server_pid=$!
  url=
  for _ in $(seq 600); do
    url=$(grep -o 'http://127.0.0.1:[0-9]*' "$work/serve.log" || true)
    [[ -n $url ]] && break
    kill -0 "$server_pid" 2>/dev/null || { cat "$work/serve.log"; exit 1; }
    sleep 0.1
  done
  for connections in 64 1000; do
    echo "== --io-threads $threads, $connections connections, ${duration} s"
    wrk -t2 -c"$connections" -d"${duration}s" --timeout 2s --latency -s "$work/post.lua" "$url/v2/models/cnn/infer" |
      grep -E 'Latency  |50%|99%|requests in|Requests/sec|Non-2xx|Socket errors'
  done
  echo "server peak RSS: $(grep VmHWM /proc/"$server_pid"/status | awk '{print $2 / 1024 " MiB"}')"
  kill -TERM "$server_pid"; wait "$server_pid" || true; server_pid=
done
