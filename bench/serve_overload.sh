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
source "$(dirname "$0")/serve_common.sh"

write_cnn_repository "" "max_queue_size = 128"
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
  start_server --io-threads "$threads"
  for connections in 64 1000; do
    echo "== --io-threads $threads, $connections connections, ${duration} s"
    wrk -t2 -c"$connections" -d"${duration}s" --timeout 2s --latency -s "$work/post.lua" "$url/v2/models/cnn/infer" |
      grep -E 'Latency  |50%|99%|requests in|Requests/sec|Non-2xx|Socket errors'
  done
  echo "server peak RSS: $(grep VmHWM /proc/"$server_pid"/status | awk '{print $2 / 1024 " MiB"}')"
  stop_server
done
