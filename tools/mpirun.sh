#!/usr/bin/env bash
# mpirun with the settings this kind of machine needs: running as root is allowed, more ranks than
# cores is allowed, waiting ranks yield the core. Usage: tools/mpirun.sh -n 2 build/tessera train ...
set -euo pipefail
# Open MPI's single-copy (CMA) path for shared-memory messages measured slower here than
# copy-in/copy-out at every size from 256 KB to 16 MB (a 2.7 MB allreduce on 2 ranks: 300 us vs
# 175 us), so it is off unless the caller set it.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_mpi_yield_when_idle=1
export OMPI_MCA_btl_vader_single_copy_mechanism=${OMPI_MCA_btl_vader_single_copy_mechanism:-none}
exec mpirun --oversubscribe --bind-to none "$@"
