#!/usr/bin/env bash
# Installs the Debian packages Tessera needs (where missing), configures and builds.
#   tools/setup.sh [BUILD_DIR] [extra cmake args...]
# Environment: TESSERA_BUILD_TYPE (Release), TESSERA_CUDA (auto: ON when /usr/local/cuda exists),
# TESSERA_SETUP (all: everything the tests and tools need, the whole build; training: only what
# building and running `tessera` needs, and only that target, without the test suite).
set -euo pipefail
cd "$(dirname "$0")/.."

build_dir=${1:-build}
shift || true

# What building and training need (TESSERA_SETUP=training: tools/quickstart.sh installs only
# these and builds only the tessera program) ...
packages=(
  build-essential cmake pkg-config
  openmpi-bin libopenmpi-dev libhdf5-openmpi-dev zlib1g-dev
  libopenblas-dev libdnnl-dev libtrilinos-kokkos-dev
  libtomlplusplus-dev libcli11-dev libfmt-dev nlohmann-json3-dev
  libpcre2-dev libicu-dev  # tokenizers: the pre-tokenizer's expressions, NFC
  dataset-fashion-mnist  # tessera prepare fashion-mnist
)
# ... and what the tests, the tools and CI add (the default, TESSERA_SETUP=all).
if [[ ${TESSERA_SETUP:-all} != training ]]; then
  packages+=(
    googletest libgtest-dev hdf5-tools
    bible-kjv bible-kjv-text python3-h5py python3-numpy python3-matplotlib
    python3-torch  # tools/load_export.py: tests/integration/test_export loads exports into PyTorch
    python3-h5py-mpi python3-mpi4py  # tools/plot_checkpoints.py --parallel (MPI-IO under mpirun)
    shellcheck munge slurmctld slurmd slurm-client  # tests/slurm: job scripts under a private Slurm
    iproute2 procps util-linux  # tests/cluster: nodes as network namespaces (ip, tc, nsenter, ps)
    clang libclang-rt-14-dev  # tests/fuzz/run_fuzzers.sh: libFuzzer targets (docs/robustness.md)
    ccache  # a compiler cache shared by every build on this machine (tools/ccache.sh)
  )
fi
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  sudo_cmd=()
  [[ $(id -u) -ne 0 ]] && sudo_cmd=(sudo)
  "${sudo_cmd[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

cuda=${TESSERA_CUDA:-auto}
if [[ $cuda == auto ]]; then
  if [[ -x /usr/local/cuda/bin/nvcc || -f /usr/local/cuda/include/cublas_v2.h ]]; then cuda=ON; else cuda=OFF; fi
fi

# Every build goes through the machine's compiler cache where ccache exists (tools/ccache.sh).
source tools/ccache.sh

targets=()
scope=(-DTESSERA_ENABLE_TESTS=ON)
if [[ ${TESSERA_SETUP:-all} == training ]]; then
  targets=(--target tessera)
  scope=(-DTESSERA_ENABLE_TESTS=OFF)
fi
cmake -S . -B "$build_dir" -DCMAKE_BUILD_TYPE="${TESSERA_BUILD_TYPE:-Release}" \
  -DTESSERA_ENABLE_CUDA="$cuda" -DCUDAToolkit_ROOT=/usr/local/cuda "${ccache_launcher[@]}" "${scope[@]}" "$@"
cmake --build "$build_dir" -j "$(nproc)" "${targets[@]}"
