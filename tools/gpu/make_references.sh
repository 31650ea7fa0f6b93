#!/usr/bin/env bash
# The data and the CPU references the `correctness` step of tools/gpu/run_on_device.sh compares
# the GPU against, made here with the CPU build (docs/gpu.md):
#   DIR/data/fashion-mnist-small.h5   the first 4096 training and 1024 test images of Debian's
#                                     Fashion-MNIST (`tessera prepare fashion-mnist`, then h5py)
#   DIR/data/corpus-small.txt, .h5    the first MiB of the King James Bible (bible-kjv), and its
#                                     byte tokens (`tessera prepare text`, 10% held out)
#   DIR/ref/DECK/losses.csv           step,loss of the 30 fp32 steps of each deck (lib.sh) on 1 rank
#   DIR/ref/DECK/step_00000015.h5     its checkpoint at step 15 (the GPU resumes it)
#   DIR/ref/tolerance.csv             deck,cpu_gemm_rel,cpu_ranks_rel,tolerance: the largest relative
#                                     difference of a loss between two GEMM kernels of one OpenBLAS
#                                     (OPENBLAS_CORETYPE=Haswell against the CPU's own), and between 1
#                                     and 2 ranks; the tolerance the GPU must meet is 100 times the
#                                     larger, at least 1e-5
# Usage: tools/gpu/make_references.sh DIR
# env: CPU_BUILD (the CPU build folder, build), PYTHON (/usr/bin/python3: Debian's, with h5py)
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$here/lib.sh"
top=$(cd "$here/../.." && pwd)
cd "$top"

fail() { echo "make_references: error: $*" >&2; exit 2; }
[[ $# -eq 1 ]] || fail "usage: tools/gpu/make_references.sh DIR"
dir=$(mkdir -p "$1" && cd "$1" && pwd)
build=${CPU_BUILD:-build}
python=${PYTHON:-/usr/bin/python3}
"$python" -c 'import h5py' 2> /dev/null || fail "$python cannot import h5py (apt-get install python3-h5py)"
tessera=$top/$build/tessera
[[ -x $tessera ]] || fail "$tessera not built (tools/setup.sh $build)"
fmnist=/usr/share/datasets/fashion-mnist
[[ -f $fmnist/train-images-idx3-ubyte.gz ]] || fail "$fmnist missing (apt-get install dataset-fashion-mnist)"
command -v bible > /dev/null || fail "no 'bible' command (apt-get install bible-kjv bible-kjv-text)"
mkdir -p "$dir/data" "$dir/ref" "$dir/work"

# --- Data ------------------------------------------------------------------------------------
# The whole of Debian's Fashion-MNIST through `tessera prepare`, then its first 4096 training and
# 1024 test rows, with every attribute, into a file of the same layout (prepare itself takes only
# the complete IDX files).
"$tessera" prepare fashion-mnist --out "$dir/work/fashion-mnist.h5"
"$python" - "$dir/work/fashion-mnist.h5" "$dir/data/fashion-mnist-small.h5" <<'PY'
import sys, h5py
with h5py.File(sys.argv[1], 'r') as src, h5py.File(sys.argv[2], 'w') as dst:
    for k, v in src.attrs.items():
        dst.attrs[k] = v
    for split, n in (('train', 4096), ('test', 1024)):
        g = dst.create_group(split)
        for k, v in src[split].attrs.items():
            g.attrs[k] = v
        for name, ds in src[split].items():
            out = g.create_dataset(name, data=ds[:n])
            for k, v in ds.attrs.items():
                out.attrs[k] = v
PY
bible -f Gen1:1-Rev22:21 < /dev/null > "$dir/work/kjv.txt"
head -c 1048576 "$dir/work/kjv.txt" > "$dir/data/corpus-small.txt"
"$tessera" prepare text --out "$dir/data/corpus-small.h5" "$dir/data/corpus-small.txt"

# --- References --------------------------------------------------------------------------------
# \brief Train deck $1 on $2 ranks into $3 with the CPU build; extra environment from $4...
cpu_train() {
  local name=$1 ranks=$2 out=$3 args
  shift 3
  mapfile -t args < <(gpu_deck_args "$name" "$dir/data" "$out")
  if ! env OPENBLAS_NUM_THREADS=1 "$@" "$top/tools/mpirun.sh" -n "$ranks" "$tessera" "${args[@]}" \
      > "$out.log" 2>&1; then
    tail -n 5 "$out.log" >&2
    fail "the CPU run $out failed; see $out.log"
  fi
  gpu_losses "$out" > "$out.csv"
}

echo "deck,cpu_gemm_rel,cpu_ranks_rel,tolerance" > "$dir/ref/tolerance.csv"
for name in "${GPU_DECKS[@]}"; do
  work=$dir/work/$name
  mkdir -p "$work" "$dir/ref/$name"
  cpu_train "$name" 1 "$work/own" env -u OPENBLAS_CORETYPE
  cpu_train "$name" 1 "$work/haswell" OPENBLAS_CORETYPE=Haswell
  cpu_train "$name" 2 "$work/ranks2" env -u OPENBLAS_CORETYPE
  cp "$work/own.csv" "$dir/ref/$name/losses.csv"
  ckpt=$(printf '%s/own/checkpoints/step_%08d.h5' "$work" "$GPU_RESUME_STEP")
  cp "$ckpt" "$dir/ref/$name/"
  gemm=$(gpu_compare_losses "$work/own.csv" "$work/haswell.csv" 1 1 | sed -E 's/.*max_rel=([^ ]+).*/\1/')
  ranks=$(gpu_compare_losses "$work/own.csv" "$work/ranks2.csv" 1 1 | sed -E 's/.*max_rel=([^ ]+).*/\1/')
  tol=$(awk -v a="$gemm" -v b="$ranks" 'BEGIN { m = a > b ? a : b; t = 100 * m; if (t < 1e-5) t = 1e-5; printf "%.2g", t }')
  echo "$name,$gemm,$ranks,$tol" >> "$dir/ref/tolerance.csv"
  echo "make_references: $name: $(wc -l < "$work/own.csv") losses; GEMM kernels differ by $gemm, 1 vs 2 ranks by $ranks; tolerance $tol"
done
rm -rf "$dir/work"
