#!/usr/bin/env bash
# The installed package as a C++ user meets it: `cmake --install BUILD` into a scratch prefix, the
# README's "As a library" program built against it with CMake's find_package (tests/consumer) and
# with pkg-config, each run once: both must train and report a test accuracy above 80%.
#   bash tests/consumer/run.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build=$1 source=$2
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
cmake --install "$build" --prefix "$scratch/prefix" > /dev/null
cmake -S "$source/tests/consumer" -B "$scratch/cmake" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$scratch/prefix" -DREADME="$source/README.md" > /dev/null
cmake --build "$scratch/cmake" > /dev/null
export PKG_CONFIG_PATH="$scratch/prefix/lib/pkgconfig"
# shellcheck disable=SC2046 # pkg-config's flags are meant to split
g++ -std=c++17 -O2 "$scratch/cmake/readme_example.cpp" -o "$scratch/pkg_config_example" \
  $(pkg-config --cflags --libs afterburner)
for program in "$scratch/cmake/readme_example" "$scratch/pkg_config_example"; do
  output=$("$program")
  echo "$(basename "$program"): $output"
  accuracy=$(sed -n 's/^test accuracy \([0-9.]*\) after one epoch$/\1/p' <<< "$output")
  [ -n "$accuracy" ] && awk -v a="$accuracy" 'BEGIN { exit !(a > 0.8) }' || {
    echo "consumer: $(basename "$program") did not train to above 80% (output: $output)" >&2
    exit 1
  }
done
