#!/usr/bin/env bash
# Installs the Debian packages (when missing), configures and builds afterburner in ./build:
# everything, or the targets given (`bash scripts/build.sh --target afterburner_cli`).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
[ -f build/CMakeCache.txt ] || cmake -S . -B build "${generator[@]}" -DCMAKE_BUILD_TYPE=Release
cmake --build build -j "$(nproc)" "$@"
