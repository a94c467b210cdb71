#!/usr/bin/env bash
# One command from a fresh Debian 12 machine to a trained model: install, build the CLI and the
# Python package alone (not the tests, benchmarks and fuzzers), install the package for Debian's
# /usr/bin/python3 (`import afterburner`), then `afterburner train` (cnn on Fashion-MNIST, the
# default recipe) with any extra flags passed through.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh --target afterburner_cli afterburner_python
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
$sudo cmake --install build --component python
./build/afterburner train "$@"
