#!/usr/bin/env bash
# The other half of the cross-build checkpoint check (docs/gpu.md): the CPU build resumes the
# GPU's step-15 checkpoints that the `correctness` step of tools/gpu/run_on_device.sh sent back
# (gpu-checkpoints.tar), trains steps 16-30 and compares those losses with the CPU reference of
# the bundle, within the bundle's tolerance; `tessera diff` shows how far the GPU's parameters at
# step 15 are from the CPU's.
# Usage: tools/gpu/resume_returned.sh FOLDER   (the folder the device tool put $OUT's files in)
# env: CPU_BUILD (build), BUNDLE_DIR (gpu-bundle: refs/ holds the references the bundle carried)
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$here/lib.sh"
top=$(cd "$here/../.." && pwd)
cd "$top"

fail() { echo "resume_returned: error: $*" >&2; exit 2; }
[[ $# -eq 1 && -f $1/gpu-checkpoints.tar ]] || fail "usage: tools/gpu/resume_returned.sh FOLDER (holding gpu-checkpoints.tar)"
refs=${BUNDLE_DIR:-gpu-bundle}/refs
tessera=$top/${CPU_BUILD:-build}/tessera
[[ -d $refs/ref && -d $refs/data ]] || fail "$refs: the references the bundle carried are missing (tools/gpu/bundle.sh)"
[[ -x $tessera ]] || fail "$tessera not built"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
tar -C "$work" -xf "$1/gpu-checkpoints.tar"
ckpt=$(printf 'step_%08d.h5' "$GPU_RESUME_STEP")
status=0
for deck in "${GPU_DECKS[@]}"; do
  gpu=$work/checkpoints/${deck}_$ckpt
  [[ -f $gpu ]] || { echo "$deck: no GPU checkpoint came back"; status=1; continue; }
  tol=$(awk -F, -v d="$deck" '$1 == d { print $4 }' "$refs/ref/tolerance.csv")
  mapfile -t args < <(gpu_deck_args "$deck" "$refs/data" "$work/$deck")
  if ! OPENBLAS_NUM_THREADS=1 tools/mpirun.sh -n 1 "$tessera" "${args[@]}" --resume "$gpu" > "$work/$deck.log" 2>&1; then
    tail -n 5 "$work/$deck.log"
    echo "$deck: the CPU build could not resume the GPU checkpoint"
    status=1
    continue
  fi
  gpu_losses "$work/$deck" > "$work/$deck.csv"
  if result=$(gpu_compare_losses "$refs/ref/$deck/losses.csv" "$work/$deck.csv" $((GPU_RESUME_STEP + 1)) "$tol"); then
    echo "$deck cpu-resumes-gpu: $result tolerance=$tol pass"
  else
    echo "$deck cpu-resumes-gpu: $result tolerance=$tol FAIL"
    status=1
  fi
  "$tessera" diff "$refs/ref/$deck/$ckpt" "$gpu" --model-only | tail -n 3
done
exit "$status"
