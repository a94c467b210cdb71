#!/usr/bin/env bash
# The sanitizer run, in ./build-asan: clang with AddressSanitizer and UndefinedBehaviorSanitizer
# (cmake/Sanitize.cmake). Builds only what it runs: the parsers', kernels', serving and training
# test binaries, then each libFuzzer target for a bounded time (tests/fuzz). Fails on any finding.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
[ -f build-asan/CMakeCache.txt ] || CXX=clang++ cmake -S . -B build-asan -G Ninja -DAFTERBURNER_SANITIZE=ON
cmake --build build-asan --target sanitizer_tests fuzzers -j "$(nproc)"
ctest --test-dir build-asan --output-on-failure -j "$(nproc)"
