#!/usr/bin/env bash
# One command from a fresh Debian 12 machine to a trained model: install, build, then
# `afterburner train` (cnn on Fashion-MNIST, 5 epochs) with any extra flags passed through.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
./build/afterburner train "$@"
