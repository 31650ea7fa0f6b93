#!/usr/bin/env bash
# Spatial parallelism across real nodes (issue 18's scale check), on the namespace cluster of
# tests/cluster/ (docs/slurm.md): the Darcy U-Net (inputs/darcy_unet.toml) with
# parallel.spatial = 4 on 4 nodes of 1 rank each (every halo crosses a link) against the same
# layout on 1 node (4 ranks) and against 1 rank alone: the first STEPS losses, the largest
# relative difference from the 1-rank run, rank 0's halo bytes per step (the program's counters)
# against the model's formula, and the bytes the nodes received over their links per step.
# Usage (as root, from the repository root, after a build): bench/cluster_unet.sh
# env: SIZE (64: fields SIZE x SIZE), BATCH (4), STEPS (30), BUILD_DIR (build)
# Writes bench/results/cluster_unet.{csv,md}; the runs stay in bench/results/tmp/cluster_unet.
set -euo pipefail
top=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$top"
# shellcheck source-path=SCRIPTDIR source=lib.sh
source bench/lib.sh
size=${SIZE:-64}
batch=${BATCH:-4}
steps=${STEPS:-30}
build=${BUILD_DIR:-build}
tessera=$(realpath "$build/tessera")
results=bench/results
work=$results/tmp/cluster_unet
rm -rf "$work" && mkdir -p "$work"
export TESSERA_CLUSTER=unet TESSERA_CLUSTER_SUBNET=10.77.32
cluster=tests/cluster/cluster.sh
trap '"$cluster" down >/dev/null 2>&1 || true' EXIT
"$cluster" up 4 >/dev/null
eval "$("$cluster" env)"

data=$work/darcy.h5
"$tessera" prepare darcy --out "$data" --size "$size" --train 16 --test 4 >/dev/null
# \brief Train the deck into $work/$1 under the launcher that follows; print the bytes the nodes
# received per step meanwhile.
train() {
  local name=$1 before after
  shift
  before=$(cluster_received_bytes)
  "$@" "$tessera" train inputs/darcy_unet.toml --set "data.path=\"$data\"" --set train.steps="$steps" \
    --set train.global_batch="$batch" --set train.log_every=1 --set run.blas_threads=1 \
    --set eval.every_epoch=false --set eval.at_end=false --set checkpoint.at_end=false \
    --set checkpoint.every_steps=0 --set run.output_dir="\"$work/$name\"" ${SPATIAL:+--set parallel.spatial=$SPATIAL} \
    >"$work/$name.out" 2>&1 || die "$name: exit $? (see $work/$name.out)"
  after=$(cluster_received_bytes)
  echo $(((after - before) / steps))
}
one=$(SPATIAL='' train one_rank env)
node1=$(SPATIAL=4 train spatial4_1node env OMPI_MCA_mpi_yield_when_idle=1 mpirun -n 4 --host "$TESSERA_CLUSTER-n1:4" --bind-to none)
nodes4=$(SPATIAL=4 train spatial4_4nodes env OMPI_MCA_mpi_yield_when_idle=1 mpirun -n 4 \
  --host "$TESSERA_CLUSTER-n1:1,$TESSERA_CLUSTER-n2:1,$TESSERA_CLUSTER-n3:1,$TESSERA_CLUSTER-n4:1" --bind-to none)

"$PEER_PYTHON" - "$work" "$size" "$batch" "$steps" "$one" "$node1" "$nodes4" >"$results/cluster_unet.csv" <<'PY'
import csv, json, sys
work, size, batch, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
link = dict(zip(["one_rank", "spatial4_1node", "spatial4_4nodes"], map(int, sys.argv[5:8])))
def losses(name):
    return [float(r["loss"]) for r in csv.DictReader(open(f"{work}/{name}/metrics.csv")) if r["kind"] == "train"]
ref = losses("one_rank")
# Halo values per sample and step that a block sends one neighbour (bench/unet_darcy.sh): in-channels
# x W at each convolution's level, forward and backward (the first convolution sends no input gradient).
convs = [(1, size), (16, size), (16, size // 2), (32, size // 2), (32, size // 4), (64, size // 4),
         (64, size // 2), (32, size // 2), (32, size), (16, size)]
formula = 4 * (2 * sum(c * w for c, w in convs) - convs[0][0] * convs[0][1]) * batch
print("layout,ranks,nodes,steps,max_rel_diff_vs_1rank,halo_bytes_per_step_rank0,formula_rank0,link_bytes_per_step,samples_per_s")
for name, ranks, nodes in [("one_rank", 1, 1), ("spatial4_1node", 4, 1), ("spatial4_4nodes", 4, 4)]:
    got = losses(name)
    assert len(got) == len(ref) == steps, (name, len(got))
    diff = max(abs(a - b) / abs(b) for a, b in zip(got, ref))
    s = json.load(open(f"{work}/{name}/summary.json"))
    halo = s.get("halo", {}).get("bytes_per_step", 0)
    print(f"{name},{ranks},{nodes},{steps},{diff:.2e},{halo:.0f},{formula if ranks > 1 else 0},{link[name]},"
          f"{s.get('samples_per_s', 0):.2f}")
PY
{
  echo "# U-Net, parallel.spatial = 4 on the namespace cluster ($(date -u +%F), $(grep -m 1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cores shared by every node)"
  echo
  echo "Fields ${size} x ${size}, global batch $batch, $steps steps, run.blas_threads = 1; links unshaped (veth)."
  echo
  echo "| layout | ranks | nodes | largest relative loss difference from 1 rank | halo bytes / step, rank 0 | formula | bytes received by the nodes / step |"
  echo "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"
  awk -F, 'NR > 1 { printf "| %s | %s | %s | %s | %s | %s | %s |\n", $1, $2, $3, $5, $6, $7, $8 }' "$results/cluster_unet.csv"
} >"$results/cluster_unet.md"
cat "$results/cluster_unet.md"
