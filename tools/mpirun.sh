#!/usr/bin/env bash
# mpirun with the settings this kind of machine needs: running as root is allowed, more ranks than
# cores is allowed, waiting ranks yield the core. Usage: tools/mpirun.sh -n 2 build/tessera train ...
#
# Ctrl-C (SIGINT) or SIGTERM to this script stops a training run the way Slurm's wall-time warning
# does: the ranks get SIGUSR1, finish the step, write a checkpoint and exit with code 4 (`--resume
# auto` continues exactly there). A second Ctrl-C or SIGTERM ends them at once. mpirun runs in its
# own process group so that a terminal's Ctrl-C reaches this script only.
set -euo pipefail
# Open MPI's single-copy (CMA) path for shared-memory messages measured slower here than
# copy-in/copy-out at every size from 256 KB to 16 MB (a 2.7 MB allreduce on 2 ranks: 300 us vs
# 175 us), so it is off unless the caller set it.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_mpi_yield_when_idle=1
export OMPI_MCA_btl_vader_single_copy_mechanism=${OMPI_MCA_btl_vader_single_copy_mechanism:-none}
# Open MPI's odls_base_sigkill_timeout stays at its default (1 s): mpirun waits twice that long
# whenever a rank ends with a non-zero exit code while another is still finishing (every error on
# 2 or more ranks: 10 s made each such exit take 20 s). Ctrl-C and SIGTERM reach the ranks through
# the trap below, not through mpirun's own signal handling.

set -m  # background jobs in their own process group
mpirun --oversubscribe --bind-to none "$@" &
mpirun_pid=$!
stop_gently() {
  echo "mpirun.sh: stop requested: the ranks checkpoint after this step and exit (again to end them now)" >&2
  kill -USR1 "$mpirun_pid" 2>/dev/null || true
  trap 'kill -TERM "$mpirun_pid" 2>/dev/null || true' INT TERM
}
trap stop_gently INT TERM
set +e
# A trapped signal interrupts `wait`; wait again until mpirun has really ended.
while kill -0 "$mpirun_pid" 2>/dev/null; do wait "$mpirun_pid"; done
wait "$mpirun_pid"
