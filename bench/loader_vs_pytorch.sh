#!/usr/bin/env bash
# The afterburner loader and torch.utils.data.DataLoader on the same data and augmentation,
# back to back, then the ratios of their medians (same worker count, and best of each).
#
#   bench/loader_vs_pytorch.sh [BUILD_DIR]      # BUILD_DIR defaults to ./build
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=${1:-build}
ours=$("$build/bench/bench_loader_throughput" --workers 0,1,2 --reps 5)
theirs=$(/usr/bin/python3 "$here/pytorch_loader.py" --workers 0,2 --reps 3)
printf '%s\n%s\n\n' "$ours" "$theirs"

# median_of <output> <workers|best>
median_of() {
  if [[ $2 == best ]]; then
    grep -o 'median=[0-9]*' <<<"$1" | cut -d= -f2 | sort -n | tail -1
  else
    grep "workers=$2 " <<<"$1" | grep -o 'median=[0-9]*' | cut -d= -f2
  fi
}
for which in 0 2 best; do
  awk -v name="$which" -v a="$(median_of "$ours" "$which")" -v b="$(median_of "$theirs" "$which")" \
    'BEGIN { printf "ratio afterburner/pytorch, workers=%s: %.1fx (%d vs %d samples/s)\n", name, a / b, a, b }'
done
