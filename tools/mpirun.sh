#!/usr/bin/env bash
# mpirun with the settings this kind of machine needs: running as root is allowed, more ranks than
# cores is allowed, waiting ranks yield the core. Usage: tools/mpirun.sh -n 2 build/tessera train ...
set -euo pipefail
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_mpi_yield_when_idle=1
exec mpirun --oversubscribe --bind-to none "$@"
