#!/usr/bin/env bash
# Functions shared by tools/gpu/make_references.sh (here, with the CPU build) and
# tools/gpu/run_on_device.sh (on the lent GPU machine, with the CUDA build): the decks of the
# `correctness` step and how their losses are read and compared. Source it; it runs nothing.

# The decks compared between the CPU and the GPU build: 30 fp32 steps each, a loss logged every
# step, no evaluation, a checkpoint at steps 15 and 30.
GPU_DECKS=(mlp cnn gpt)
GPU_STEPS=30
GPU_RESUME_STEP=15

# \brief Print the `tessera train` arguments of a correctness deck, one per line (read them with
# mapfile). Relative paths are relative to the repository root.
# \param $1 deck name (mlp, cnn, gpt), $2 data folder (fashion-mnist-small.h5, corpus-small.h5),
# $3 run.output_dir
gpu_deck_args() {
  local name=$1 data=$2 out=$3 deck path
  case $name in
    mlp) deck=inputs/fashion_mnist_mlp-ci.toml path=$data/fashion-mnist-small.h5 ;;
    cnn) deck=inputs/fashion_mnist_cnn.toml path=$data/fashion-mnist-small.h5 ;;
    gpt) deck=inputs/kjv_gpt.toml path=$data/corpus-small.h5 ;;  # smaller below: its checkpoint travels
    *)
      echo "error: unknown deck '$name' (known: ${GPU_DECKS[*]})" >&2
      return 1
      ;;
  esac
  local shape=()
  # The default GPT's checkpoint (3.2M parameters and AdamW's two moments: 39 MB) would not fit
  # the device tool's 64 MiB: 2 blocks of width 128, heads of 64 (the fused kernel's width of
  # GPT-2), context 64; 0.44M parameters.
  [[ $name == gpt ]] && shape=(--set model.layers=2 --set model.width=128 --set model.heads=2 --set model.context=64)
  printf '%s\n' train "$deck" "${shape[@]}" \
    --set "data.path=\"$path\"" --set "run.output_dir=\"$out\"" --set run.overwrite=true \
    --set "train.steps=$GPU_STEPS" --set train.log_every=1 --set schedule.warmup_steps=5 \
    --set eval.every_epoch=false --set eval.every_steps=0 --set eval.at_end=false \
    --set "checkpoint.every_steps=$GPU_RESUME_STEP" --set checkpoint.keep=2 --set checkpoint.at_end=true
}

# \brief Print "step,loss" of the train rows of a run's metrics.csv.
# \param $1 run directory
gpu_losses() {
  awk -F, 'NR > 1 && $1 == "train" { print $2 "," $4 }' "$1/metrics.csv"
}

# \brief Compare two "step,loss" files over the steps of the second from step $3 on: print
# "steps=N max_rel=X at_step=S" and succeed when every |a-b| / max(|a|,|b|) is within $4 and the
# second file has every step of the first from $3 on.
# \param $1 reference, $2 candidate, $3 first step compared, $4 tolerance
gpu_compare_losses() {
  awk -F, -v from="$3" -v tol="$4" '
    NR == FNR { if ($1 >= from) ref[$1] = $2; next }
    $1 >= from && ($1 in ref) {
      a = ref[$1] + 0; b = $2 + 0; d = a - b; if (d < 0) d = -d
      m = a < 0 ? -a : a; mb = b < 0 ? -b : b; if (mb > m) m = mb; if (m < 1e-30) m = 1e-30
      r = d / m; if (r > worst || n == 0) { worst = r; at = $1 }
      seen[$1] = 1; n++
      if (b != b) nan = 1
    }
    END {
      missing = 0; for (s in ref) if (!(s in seen)) missing++
      printf "steps=%d max_rel=%.3g at_step=%s missing=%d\n", n, worst, at, missing
      exit (n == 0 || missing > 0 || nan || worst > tol) ? 1 : 0
    }' "$1" "$2"
}
