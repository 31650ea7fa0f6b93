#!/usr/bin/env bash
# mpirun with the settings this kind of machine needs: running as root is allowed, more ranks than
# cores is allowed, waiting ranks yield the core. Usage: tools/mpirun.sh -n 2 build/tessera train ...
#
# Ctrl-C (SIGINT) or SIGTERM to this script stops a training run the way Slurm's wall-time warning
# does: the ranks get SIGUSR1, finish the step, write a checkpoint and exit with code 4 (`--resume
# auto` continues exactly there). A second Ctrl-C or SIGTERM ends them at once. mpirun runs in its
# own process group so that a terminal's Ctrl-C reaches this script only.
set -euo pipefail
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_mpi_yield_when_idle=1
# Open MPI's single-copy (CMA) path for shared-memory messages: faster or slower depending on the
# CPU (one EPYC: a 2.7 MB allreduce on 2 ranks took 300 us with it, 175 without; a Xeon: MPI's
# allreduce 1.6-1.8x faster with it). tools/choose_transport.sh measures both here and writes the
# winner to the transport file, read below when it was measured on this CPU model; the caller's
# own OMPI_MCA_btl_vader_single_copy_mechanism always wins; without either it is off.
transport_file=${TESSERA_TRANSPORT_FILE:-${XDG_CACHE_HOME:-${HOME:-/root}/.cache}/tessera/transport}
if [[ -z ${OMPI_MCA_btl_vader_single_copy_mechanism:-} && -r $transport_file ]]; then
  measured_on=$(sed -n 's/^cpu=//p' "$transport_file" | head -n 1)
  this_cpu=$(grep -m 1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs || true)
  chosen=$(sed -n 's/^OMPI_MCA_btl_vader_single_copy_mechanism=\(cma\|none\)$/\1/p' "$transport_file" | tail -n 1)
  if [[ -n $chosen && $measured_on == "$this_cpu" ]]; then
    export OMPI_MCA_btl_vader_single_copy_mechanism=$chosen
  else
    echo "mpirun.sh: ignoring $transport_file (measured on '$measured_on', this is '$this_cpu', or no valid" \
      "setting in it); run tools/choose_transport.sh here" >&2
  fi
fi
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
