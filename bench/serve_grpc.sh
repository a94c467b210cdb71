#!/usr/bin/env bash
# The same `afterburner serve` (the zoo's cnn, max_batch_size 64) over three protocols, loaded by
# `afterburner loadgen` in a closed loop at 1 and 64 concurrent requests (HTTP connections, or
# gRPC streams on one HTTP/2 connection): HTTP with JSON tensors, HTTP with the binary tensor
# extension (--binary), and KServe v2 gRPC's ModelInfer with raw contents (--grpc-port). The
# three alternate within each repetition, on one server; single-sample requests.
#
#   bench/serve_grpc.sh [BUILD_DIR] [DURATION_SECONDS] [REPETITIONS]
set -euo pipefail

build=${1:-build}
duration=${2:-10}
repetitions=${3:-3}
cli=$build/afterburner
source "$(dirname "$0")/serve_common.sh"

write_cnn_repository
start_server --grpc-port 0
grpc_url=grpc://$(grep -o 'gRPC on [0-9.:]*' "$work/serve.log" | awk '{print $3}')
for repetition in $(seq "$repetitions"); do
  for protocol in "json $url" "binary $url --binary" "grpc $grpc_url"; do
    set -- $protocol
    echo "== repetition $repetition: $1"
    "$cli" loadgen --model cnn --concurrency 1,64 --duration "$duration" --url "${@:2}" | tail -2
  done
done
stop_server
