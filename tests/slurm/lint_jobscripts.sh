#!/usr/bin/env bash
# Every job script in jobscripts/ does what docs/slurm.md promises: asks for a warning signal
# before the time limit (--signal=B:USR1@N), validates the deck with `tessera check` before the
# expensive part, resumes with --resume auto and hands the run to tessera_run (which forwards the
# signal and requeues on exit code 4). Run from the repository root.
set -euo pipefail
status=0
scripts=(jobscripts/*.sbatch)
for script in "${scripts[@]}"; do
  for pattern in '^#SBATCH --signal=B:USR1@[0-9]+' '^source .*tessera-job\.sh"?$' '^tessera_check ' \
    '^tessera_run .* --resume auto' '^#SBATCH --time=' '^set -euo pipefail$'; do
    if ! grep -Eq "$pattern" "$script"; then
      echo "$script: no line matches $pattern"
      status=1
    fi
  done
done
((status == 0)) && echo "ok: ${#scripts[@]} job scripts"
exit "$status"
