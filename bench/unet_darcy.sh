#!/usr/bin/env bash
# The Darcy U-Net (inputs/darcy_unet.toml), in one sitting:
#  1. accuracy: Tessera on 2 ranks (data parallel) and the PyTorch peer (bench/unet_torch.py, the
#     same network and training, its own initial weights and sample order) on the same `tessera
#     prepare darcy` file, for each seed of SEEDS; relative L2 test error per epoch and samples/s
#     -> results/unet_darcy_accuracy.csv, the medians over the seeds -> results/unet_darcy_accuracy.md
#  2. spatial parallelism on large fields (SIZE x SIZE, default 256): samples/s of spatial = 1 on
#     1 rank, spatial = 2 (halo overlap on and off) and data = 2 on 2 ranks (median over steps >= 3
#     of metrics.csv), rank 0's measured activation memory, halo bytes per step against the
#     model's formula and the time rank 0 waited for halos -> results/unet_spatial.{csv,md}
# env: BUILD_DIR (build), EPOCHS (20), SEEDS ("1234 1 2"), NORMALIZE (auto: data.normalize, and the
#      peer's --normalize channel; none: raw fields in both), SIZE (256), STEPS (8), BATCH (4),
#      SKIP_ACCURACY=1, SKIP_SPATIAL=1, SUMMARY_ONLY=1 (tables from the runs already made)
set -euo pipefail
top=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$top"
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$top/bench/lib.sh"
build=${BUILD_DIR:-build}
epochs=${EPOCHS:-20}
seeds=${SEEDS:-1234 1 2}
normalize=${NORMALIZE:-auto}
peer_normalize=channel
[[ $normalize == none ]] && peer_normalize=none
size=${SIZE:-256}
steps=${STEPS:-8}
batch=${BATCH:-4}
res=bench/results
tmp=$res/tmp/unet
mkdir -p "$res/logs" "$tmp" data
[[ -x "$build/tessera" ]] || die "$build/tessera not found" "build first: tools/setup.sh"
stamp="# $(date -u +%FT%TZ) $(lscpu | sed -n 's/^Model name: *//p') OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-unset} load $(cut -d' ' -f1-3 /proc/loadavg)"

if [[ "${SKIP_ACCURACY:-0}" != 1 ]]; then
  [[ -f data/darcy64.h5 ]] || tools/mpirun.sh -n 2 "$build/tessera" prepare darcy --out data/darcy64.h5 --size 64 --train 1000 --test 100
  for seed in $seeds; do
    [[ "${SUMMARY_ONLY:-0}" == 1 ]] && break
    tools/mpirun.sh -n 2 "$build/tessera" train inputs/darcy_unet.toml --set train.epochs="$epochs" \
      --set run.seed="$seed" --set data.normalize="\"$normalize\"" --set run.blas_threads=1 \
      --set run.output_dir="\"$tmp/accuracy_$seed\"" --set run.overwrite=true >"$res/logs/unet_tessera_$seed.log" 2>&1
    OPENBLAS_NUM_THREADS=1 "$PEER_PYTHON" bench/unet_torch.py --data data/darcy64.h5 --epochs "$epochs" --threads 2 \
      --seed "$seed" --order torch --normalize "$peer_normalize" >"$res/logs/unet_torch_$seed.log" 2>&1
  done
  {
    echo "$stamp"
    echo "# tessera: tools/mpirun.sh -n 2 build/tessera train inputs/darcy_unet.toml --set train.epochs=$epochs --set run.seed=SEED --set data.normalize=\"$normalize\" --set run.blas_threads=1"
    echo "# peer:    OPENBLAS_NUM_THREADS=1 /usr/bin/python3 bench/unet_torch.py --data data/darcy64.h5 --epochs $epochs --threads 2 --seed SEED --order torch --normalize $peer_normalize"
    "$PEER_PYTHON" - "$tmp" "$res/logs" "$seeds" <<'PY'
import csv, re, sys
tmp, logs, seeds = sys.argv[1], sys.argv[2], sys.argv[3].split()
print("who,seed,epoch,test_rel_l2,samples_per_s")
for seed in seeds:
    rows = list(csv.DictReader(open(f"{tmp}/accuracy_{seed}/metrics.csv")))
    rate = sorted(float(r["samples_per_s"]) for r in rows if r["kind"] == "train" and r["samples_per_s"])
    for r in rows:
        if r["kind"] == "eval":
            print(f"tessera,{seed},{float(r['epoch']):.0f},{float(r['rel_l2']):.4f},{rate[len(rate)//2]:.1f}")
    for line in open(f"{logs}/unet_torch_{seed}.log"):
        m = re.match(r"epoch (\d+) loss \S+ test rel L2 (\S+) samples/s (\S+)", line)
        if m: print(f"torch,{seed},{m[1]},{float(m[2]):.4f},{m[3]}")
PY
  } >"$res/unet_darcy_accuracy.csv"
  "$PEER_PYTHON" - "$res/unet_darcy_accuracy.csv" "$epochs" <<'PY' >"$res/unet_darcy_accuracy.md"
import csv, statistics, sys
rows = [r for r in csv.DictReader(l for l in open(sys.argv[1]) if not l.startswith("#")) if r["epoch"] == sys.argv[2]]
print(f"| who | test relative L2 after {sys.argv[2]} epochs, per seed | median | samples/s (median) |")
print("| --- | --- | --- | --- |")
for who in ("tessera", "torch"):
    mine = [r for r in rows if r["who"] == who]
    errs = [float(r["test_rel_l2"]) for r in mine]
    each = ", ".join("%.4f (seed %s)" % (e, r["seed"]) for e, r in zip(errs, mine))
    print(f"| {who} | {each} | "
          f"{statistics.median(errs):.4f} | {statistics.median(float(r['samples_per_s']) for r in mine):.1f} |")
PY
  cat "$res/unet_darcy_accuracy.csv" "$res/unet_darcy_accuracy.md"
fi
[[ "${SKIP_SPATIAL:-0}" == 1 ]] && exit 0

big=data/darcy$size.h5
[[ -f "$big" ]] || tools/mpirun.sh -n 2 "$build/tessera" prepare darcy --out "$big" --size "$size" --train 16 --test 2
run() {  # name ranks args...
  local name=$1 ranks=$2
  shift 2
  tools/mpirun.sh -n "$ranks" "$build/tessera" train inputs/darcy_unet.toml --set data.path="\"$big\"" \
    --set train.steps="$steps" --set train.global_batch="$batch" --set train.log_every=1 --set run.blas_threads=1 \
    --set eval.every_epoch=false --set eval.at_end=false --set checkpoint.at_end=false --set schedule.warmup_steps=0 \
    --set run.output_dir="\"$tmp/$name\"" --set run.overwrite=true "$@" >"$res/logs/unet_$name.log" 2>&1
}
run spatial1 1
run spatial2 2 --set parallel.spatial=2
run spatial2_no_overlap 2 --set parallel.spatial=2 --set parallel.halo_overlap=false
run data2 2 --set parallel.data=2
{
  echo "$stamp"
  echo "# fields ${size}x${size}, channels [16, 32, 64], global batch $batch, $steps steps, run.blas_threads = 1"
  "$PEER_PYTHON" - "$tmp" "$size" "$batch" <<'PY'
import csv, json, re, sys
tmp, size, batch = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
# Halo values per sample and step to one neighbour: sum over convolutions of in-channels x W at
# that level (k/2 = 1 row), forward and backward (the first convolution sends no input gradient).
convs = [(1, size), (16, size), (16, size // 2), (32, size // 2), (32, size // 4), (64, size // 4),
         (64, size // 2), (32, size // 2), (32, size), (16, size)]
fwd = sum(c * w for c, w in convs)
formula = 4 * (2 * fwd - convs[0][0] * convs[0][1])
print("layout,ranks,samples_per_s,activations_mb_rank0,halo_bytes_per_step,formula_bytes_per_step,halo_wait_s_per_step")
for name, ranks, per_rank in [("spatial1", 1, batch), ("spatial2", 2, batch), ("spatial2_no_overlap", 2, batch), ("data2", 2, batch // 2)]:
    d = f"{tmp}/{name}"
    rate = sorted(float(r["samples_per_s"]) for r in csv.DictReader(open(f"{d}/metrics.csv"))
                  if r["kind"] == "train" and int(r["step"]) >= 3 and r["samples_per_s"])
    log = open(f"{d}/log.txt").read()
    act = re.search(r"measured peak, rank 0\): .*activations ([0-9.]+) MB", log)
    s = json.load(open(f"{d}/summary.json"))
    h = s.get("halo", {})
    spatial = name.startswith("spatial2")
    print(f"{name},{ranks},{rate[len(rate)//2]:.2f},{act[1] if act else ''},{h.get('bytes_per_step', 0):.0f},"
          f"{formula * per_rank if spatial else 0},{h.get('wait_s_per_step', 0):.4f}")
PY
} >"$res/unet_spatial.csv"
cat "$res/unet_spatial.csv"
