#!/usr/bin/env bash
# Regenerates the fuzz seeds (tests/fuzz/seeds/<target>/) and the deck dictionary
# (tests/fuzz/deck.dict) with a normal build's tessera (docs/robustness.md):
#  - deck/: the decks of inputs/, tests/integration/ and seed_mlp.toml behind fuzz_deck.cpp's
#    8-byte header (rank count and the synthetic dataset), some with --set overrides after a NUL;
#  - dataset/: supervised.h5 and regression.h5 (tessera_fuzz_seed_data, io::DatasetWriter) and
#    tokens.h5 (`tessera prepare text`);
#  - checkpoint/: the checkpoint of seed_mlp.toml after 3 steps on 1 rank (`tessera train`).
# Usage: tests/fuzz/make_seeds.sh [BUILD_DIR]   (default build; it must hold tessera and the
# tests, e.g. tools/setup.sh build)
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build}
seeds=tests/fuzz/seeds
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export OPENBLAS_NUM_THREADS=1

rm -rf "$seeds"
mkdir -p "$seeds/deck" "$seeds/dataset" "$seeds/checkpoint"

# Datasets and the dictionary.
"$build/tests/fuzz/tessera_fuzz_seed_data" "$work"
cp "$work/supervised.h5" "$work/regression.h5" "$seeds/dataset/"
cp "$work/deck.dict" tests/fuzz/deck.dict
printf 'In the beginning was the deck, and the deck was checked; every key had its line and every\nvalue its range. A damaged file said so in one line, and nothing was lost.\n' >"$work/text.txt"
"$build/tessera" prepare text --out "$seeds/dataset/tokens.h5" --val-fraction 0.25 "$work/text.txt" >/dev/null

# The checkpoint.
tools/mpirun.sh -n 1 "$build/tessera" train tests/fuzz/seed_mlp.toml --set data.path="$work/supervised.h5" \
  --set run.output_dir="$work/run" >/dev/null
cp "$work/run/checkpoints/step_00000003.h5" "$seeds/checkpoint/mlp_step3.h5"

# Decks. The header (fuzz_deck.cpp): ranks - 1, kind (0 labels [F], 1 images [C,S,S] with
# S = 1 + F % 64, 2 targets [F], 3 tokens of vocabulary F), F - 1 (2 bytes, little-endian),
# classes - 1, channels, samples - 1 (2 bytes).
deck_seed() {  # NAME HEADER DECK [OVERRIDES]
  { printf '%b' "$2"; cat "$3"; [[ -z ${4:-} ]] || printf '\0%s' "$4"; } >"$seeds/deck/$1"
}
fmnist_2d='\x01\x01\x1a\x00\x09\x00\x5f\xea'  # 2 ranks, [28, 28], 10 classes, 60000 samples
fmnist_3d='\x01\x01\x1a\x00\x09\x01\x5f\xea'  # 2 ranks, [1, 28, 28]
text='\x01\x03\xff\x00\x00\x00\xd0\x84'       # 2 ranks, 256 tokens, 34001 windows
for deck in inputs/*.toml tests/integration/*.toml; do
  name=$(basename "$deck" .toml)
  case $name in
    *gpt*) deck_seed "$name" "$text" "$deck" ;;
    *cnn*) deck_seed "$name" "$fmnist_3d" "$deck" ;;
    *) deck_seed "$name" "$fmnist_2d" "$deck" ;;
  esac
done
deck_seed seed_mlp '\x00\x01\x02\x00\x02\x00\x17\x00' tests/fuzz/seed_mlp.toml
deck_seed all_keys "$fmnist_2d" "$work/all_keys.toml"
deck_seed all_keys_gpt "$text" "$work/all_keys.toml" 'model.kind=gpt'
deck_seed mlp_flat_4ranks '\x03\x00\x0f\x03\x09\x00\x5f\xea' tests/integration/mlp_test.toml \
  $'parallel.data=2\nparallel.tensor=2\nparallel.zero=1\nparallel.micro_batches=2\noptimizer.kind="adamw"'
deck_seed mlp_targets '\x00\x02\x07\x00\x02\x00\x63\x00' tests/integration/mlp_test.toml $'model.loss=mse\ntrain.global_batch=10'
deck_seed gpt_layout_8ranks '\x07\x03\xff\x00\x00\x00\xd0\x84' tests/integration/gpt_test.toml \
  $'parallel.pipeline=2\nparallel.tensor=2\nparallel.schedule=gpipe\nparallel.micro_batches=4\ntrain.recompute=true'
deck_seed cnn_fp16 '\x01\x01\x1a\x00\x09\x03\x5f\xea' inputs/fashion_mnist_cnn.toml \
  $'train.precision=fp16\nparallel.tensor=2\ncomm.allreduce=ring'

ls -l "$seeds"/*/ tests/fuzz/deck.dict
