# Sourced by the serving benchmarks (serve_load.sh, serve_overload.sh): a repository holding the
# zoo's cnn, trained briefly (served latency does not depend on its weights), and `afterburner
# serve` started and stopped over it, in a scratch directory `work` removed on exit (the server
# stopped first). The caller sets `cli`, the afterburner binary, before sourcing it.
server_pid=
work=$(mktemp -d)
cleanup() {
  if [[ -n $server_pid ]]; then stop_server; fi
  rm -rf "$work"
}
trap cleanup EXIT

# write_cnn_repository [PRECISION] [EXTRA_CONFIG_LINE]: $work/models/cnn with its config.toml; the
# plain export, or `afterburner optimize`'s result at PRECISION (fp32, bf16, int8).
write_cnn_repository() {
  local precision=${1:-} extra=${2:-}
  mkdir -p "$work/models/cnn"
  "$cli" train --model cnn --max-steps 20 --epochs 1 --progress none --export "$work/cnn.pt" >/dev/null
  if [[ -n $precision ]]; then
    "$cli" optimize "$work/cnn.pt" -o "$work/models/cnn/model.pt" --precision "$precision" --force \
      --measure-seconds 0 >/dev/null
  else
    cp "$work/cnn.pt" "$work/models/cnn/model.pt"
  fi
  cat > "$work/models/cnn/config.toml" <<TOML
max_batch_size = 64
max_queue_delay_us = 2000
preferred_batch_sizes = [16, 32, 64]
instances = 1
$extra
[[input]]
name = "input"
datatype = "FP32"
dims = [1, 28, 28]
[[output]]
name = "output"
datatype = "FP32"
dims = [10]
TOML
}

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
  wait "$server_pid" || true
  server_pid=
}
