#!/usr/bin/env bash
# The second PyTorch peer: a current torch from PyPI (with MKL and oneDNN) in .venv at the top of
# the repository, for side-by-side runs of ../shared/peers/*.py beside Debian's python3-torch.
# About 5 GB (the wheel pulls NVIDIA's CUDA libraries, unused here). Peers only: Tessera itself
# never needs it. h5py too, for bench/unet_torch.py.
#   bench/peer_venv.sh [TORCH_SPEC]   (default: torch, the newest release)
set -euo pipefail
cd "$(dirname "$0")/.."
spec=${1:-torch}
[[ -x .venv/bin/python ]] || python3 -m venv .venv
.venv/bin/pip install -q numpy h5py "$spec"   # h5py: bench/unet_torch.py reads the HDF5 file
.venv/bin/python -c 'import torch; print("torch", torch.__version__, "BLAS:", torch.__config__.show().count("Math Kernel") and "MKL" or "other")'
