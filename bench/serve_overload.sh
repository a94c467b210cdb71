#!/usr/bin/env bash
# Overload: `afterburner serve` (the zoo's cnn, max_batch_size 64, max_queue_size QUEUE) held by
# 64, 1,000 and 10,000 keep-alive connections of single-sample JSON requests from `afterburner
# loadgen` (2 client threads, 2 s timeout) on the same machine. Each repetition starts a server
# per --io-threads value in turn and runs on it:
#   baseline    64 connections, closed loop: the model's capacity
#   open-Fx     1,000 connections, Poisson arrivals at F times that capacity (F in FACTORS,
#               default 1.5 and 2): the queue stays full, the surplus is refused with 503
#   closed      1,000 connections, closed loop (wrk's load: each answer is followed at once by a
#               new request, so that 1,000 requests are always outstanding)
#   10k         10,000 connections, Poisson arrivals at the first factor times the capacity
# and prints per row answers/s, accepted (200)/s, 503/s, other statuses, timeouts, connection
# errors, the accepted requests' p50 and p99 (and p99 over the baseline's), the server's resident
# memory after the row; then its peak.
#
#   bench/serve_overload.sh [BUILD_DIR] [DURATION_SECONDS] [REPETITIONS] [QUEUE] [IO_THREADS...]
set -euo pipefail

build=${1:-build}
duration=${2:-10}
repetitions=${3:-3}
queue=${4:-64}
shift $(( $# >= 4 ? 4 : $# ))
io_threads=("${@:-1}")
factors=(${FACTORS:-1.5 2})
cli=$build/afterburner
source "$(dirname "$0")/serve_common.sh"

write_cnn_repository "" "max_queue_size = $queue"

# load NAME CONNECTIONS RATE: one loadgen row (RATE 0: closed loop), printed as a table row.
load() {
  local name=$1 connections=$2 rate=$3
  local args=(--url "$url" --model cnn --concurrency "$connections" --duration "$duration" --timeout 2 --threads 2 --json)
  if [[ $rate != 0 ]]; then args+=(--rate "$rate"); fi
  "$cli" loadgen "${args[@]}" > "$work/$name.json"
  local rss
  rss=$(awk '/VmRSS/ {print $2 / 1024}' /proc/"$server_pid"/status)
  /usr/bin/python3 - "$work/$name.json" "$name" "$rss" "${baseline_p99:-0}" <<'PY'
import json, sys
result = json.load(open(sys.argv[1]))[0]
name, rss, baseline = sys.argv[2], float(sys.argv[3]), float(sys.argv[4])
seconds = result["seconds"]
rejected = result["statuses"].get("503", 0) / seconds
other = sum(n for s, n in result["statuses"].items() if s not in ("200", "503"))
ratio = f"{result['accepted_p99_ms'] / baseline:.2f}x" if baseline else "1x"
rate = f"{result['rate']:.0f}/s" if result["rate"] else "closed"
print(f"| {name} | {result['concurrency']} | {rate} | {result['requests_per_second']:.0f} | "
      f"{result['accepted_per_second']:.0f} | {rejected:.0f} | {other} | {result['timeouts']} | "
      f"{result['connection_errors']} | {result['accepted_p50_ms']:.1f} | {result['accepted_p99_ms']:.1f} | "
      f"{ratio} | {rss:.0f} |")
PY
}

field() { /usr/bin/python3 -c "import json, sys; print(json.load(open(sys.argv[1]))[0][sys.argv[2]])" "$1" "$2"; }
times() { /usr/bin/python3 -c "print(round($1 * $2))"; }

for repetition in $(seq "$repetitions"); do
  for threads in "${io_threads[@]}"; do
    start_server --max-connections 10100 --io-threads "$threads"
    echo "== repetition $repetition, --io-threads $threads: max_queue_size $queue, ${duration} s per row"
    echo "| row | connections | arrivals | answers/s | 200/s | 503/s | other | timeouts | errors | 200 p50 ms | 200 p99 ms | p99 / baseline | RSS MiB |"
    echo "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
    baseline_p99=
    load baseline 64 0
    baseline_p99=$(field "$work/baseline.json" accepted_p99_ms)
    capacity=$(field "$work/baseline.json" accepted_per_second)
    for factor in "${factors[@]}"; do load "open-${factor}x" 1000 "$(times "$factor" "$capacity")"; done
    load closed 1000 0
    load 10k 10000 "$(times "${factors[0]}" "$capacity")"
    echo "server peak RSS: $(awk '/VmHWM/ {print $2 / 1024 " MiB"}' /proc/"$server_pid"/status)"
    stop_server
  done
done
