#!/usr/bin/env bash
# MPIEXEC_EXECUTABLE of the CUDA build (docs/gpu.md): its tests start their ranks through this
# file, which runs the first `mpiexec` on PATH: Debian's here, the bundle's on the lent GPU machine
# (tools/gpu/run_on_device.sh puts the bundle's bin/ first), so the same build runs in both places.
exec mpiexec "$@"
