#!/usr/bin/env bash
# The CNN on Fashion-MNIST on 2 ranks for 15 epochs (inputs/fashion_mnist_cnn.toml): test accuracy
# and seconds per epoch from metrics.csv, into bench/results/cnn_fmnist.csv (epoch,step,wall_s,
# test_loss,test_accuracy), with the command, date and OPENBLAS_CORETYPE in a header comment.
#   tools/mpirun.sh -n 2 build/tessera train inputs/fashion_mnist_cnn.toml --set run.output_dir=...
# env: BUILD_DIR (build), RANKS (2)
set -euo pipefail
top=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$top"
build=${BUILD_DIR:-build}
ranks=${RANKS:-2}
out=bench/results/tmp/cnn_fmnist
csv=bench/results/cnn_fmnist.csv
[[ -x "$build/tessera" ]] || { echo "error: $build/tessera not found" >&2; exit 1; }
[[ -f data/fashion-mnist.h5 ]] || "$build/tessera" prepare fashion-mnist --out data/fashion-mnist.h5
mkdir -p bench/results/logs "$out"
cmd=(tools/mpirun.sh -n "$ranks" "$build/tessera" train inputs/fashion_mnist_cnn.toml
     --set "run.output_dir=\"$out\"" --set run.overwrite=true)
"${cmd[@]}" >bench/results/logs/cnn_fmnist.log 2>&1
{
  echo "# ${cmd[*]}"
  echo "# $(date -u +%FT%TZ) OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-unset} load $(cut -d' ' -f1-3 /proc/loadavg)"
  /usr/bin/python3 - "$out/metrics.csv" <<'PY'
import csv, sys
print("epoch,step,wall_s,test_loss,test_accuracy")
for r in csv.DictReader(open(sys.argv[1])):
    if r['kind'] == 'eval':
        print(f"{float(r['epoch']):.0f},{r['step']},{float(r['wall_s']):.1f},{float(r['loss']):.4f},{float(r['accuracy']):.4f}")
PY
} >"$csv"
cat "$csv"
