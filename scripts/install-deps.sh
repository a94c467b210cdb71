#!/usr/bin/env bash
# Installs everything afterburner needs on Debian 12, from Debian's packages only.
# Idempotent: packages already present are left as they are. Run as root.
set -euo pipefail

packages=(
  build-essential cmake ninja-build ccache pkg-config
  libtorch-dev libopenblas0-pthread libgloo-dev libdnnl-dev libideep-dev
  libgtest-dev libgmock-dev
  libcli11-dev nlohmann-json3-dev libfmt-dev libtomlplusplus-dev zlib1g-dev libzip-dev
  libboost-dev libsimdjson-dev wrk
  liblapack-dev                         # linalg: geqp3 (column-pivoted QR) for cqrrpt
  libgrpc++-dev protobuf-compiler-grpc protobuf-compiler   # serve's gRPC endpoint (proto/inference.proto)
  libjpeg62-turbo-dev libturbojpeg0-dev libspng-dev   # users' image folders: JPEG and PNG (data/image_file.h)
  libtcmalloc-minimal4                  # the afterburner tool's memory allocator (tools/CMakeLists.txt)
  iproute2                              # the two-host test: network namespaces joined by a veth pair
  python3-torch python3-numpy python3-pytest   # baselines, differential tests, the Python package's tests
  python3-torchvision                   # torchvision's architectures in the tests of the whole user path
  python3-pil                           # the image tests' reference decoder (PIL, as torchvision's ImageFolder)
  clang libclang-rt-14-dev libomp-dev   # the sanitizer build and the fuzzers (.ci/run)
  chromium fonts-dejavu-core            # the dashboard test: the page in a headless browser, its text legible
  dataset-fashion-mnist
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#packages[@]} packages already installed"
  exit 0
fi

sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
echo "install-deps: installed ${missing[*]}"
