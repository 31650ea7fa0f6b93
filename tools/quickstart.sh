#!/usr/bin/env bash
# From a fresh clone: install what training needs, build the tessera program, prepare
# Fashion-MNIST and train the default deck on 2 ranks. The tests, Slurm, the fuzzers and the
# Python tools' packages are tools/test.sh's (tools/setup.sh installs them by default).
set -euo pipefail
cd "$(dirname "$0")/.."
TESSERA_SETUP=training tools/setup.sh build
[[ -f data/fashion-mnist.h5 ]] || build/tessera prepare fashion-mnist --out data/fashion-mnist.h5
build/tessera check inputs/fashion_mnist_mlp.toml --ranks 2
tools/mpirun.sh -n 2 build/tessera train inputs/fashion_mnist_mlp.toml --resume auto "$@"
