#!/usr/bin/env bash
# One command from a fresh Debian 12 machine to a trained model: install, build the CLI alone
# (not the tests, benchmarks and fuzzers), then `afterburner train` (cnn on Fashion-MNIST, the
# default recipe) with any extra flags passed through.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh --target afterburner_cli
./build/afterburner train "$@"
