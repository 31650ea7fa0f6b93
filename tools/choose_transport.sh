#!/usr/bin/env bash
# Measures Open MPI's shared-memory transport both ways on this machine and writes the faster one
# where tools/mpirun.sh reads it. The setting is btl_vader_single_copy_mechanism: "cma" (a large
# message is copied once, by the receiver, from the sender's memory: Linux cross-memory attach)
# or "none" (copy-in/copy-out through shared buffers). Which is faster depends on the CPU and
# kernel: on one AMD EPYC none was faster (a 2.7 MB allreduce on 2 ranks: 175 us against 300),
# on a Xeon cma made MPI's allreduce 1.6-1.8x faster. Open MPI reads the setting at MPI_Init, so
# each setting is its own `tessera bench comm` run (MPI's allreduce and the ring), alternated
# REPS times; the time of a row is the median of its runs.
#
#   tools/choose_transport.sh [--reps N] [--sizes LO..HI] [--iters N] [--ranks N] [--out FILE] [--dry-run]
#
# The winner is the setting with the lower geometric mean of time per call over every row (both
# algorithms, every size); within 3% of each other the file keeps "none" (mpirun.sh's default).
# FILE defaults to ${XDG_CACHE_HOME:-$HOME/.cache}/tessera/transport (TESSERA_TRANSPORT_FILE
# overrides, as in mpirun.sh); --dry-run prints the table and the choice, writes nothing.
# Environment: TESSERA (build/tessera).
set -euo pipefail
cd "$(dirname "$0")/.."

reps=3 sizes=256K..16M iters=10 ranks=2 dry_run=0
out=${TESSERA_TRANSPORT_FILE:-${XDG_CACHE_HOME:-${HOME:-/root}/.cache}/tessera/transport}
usage() {
  echo "usage: tools/choose_transport.sh [--reps N] [--sizes LO..HI] [--iters N] [--ranks N] [--out FILE] [--dry-run]" >&2
  exit 2
}
while (($#)); do
  case $1 in
    --reps) reps=${2:?}; shift 2 ;;
    --sizes) sizes=${2:?}; shift 2 ;;
    --iters) iters=${2:?}; shift 2 ;;
    --ranks) ranks=${2:?}; shift 2 ;;
    --out) out=${2:?}; shift 2 ;;
    --dry-run) dry_run=1; shift ;;
    *) usage ;;
  esac
done
[[ $reps =~ ^[1-9][0-9]*$ && $iters =~ ^[1-9][0-9]*$ && $ranks =~ ^[1-9][0-9]*$ ]] || usage
tessera=${TESSERA:-build/tessera}
[[ -x $tessera ]] || { echo "choose_transport: $tessera not found; build first (tools/setup.sh)" >&2; exit 2; }

work=$(mktemp -d /tmp/tessera-transport.XXXXXX)
trap 'rm -rf "$work"' EXIT
# setting,algorithm,bytes,time_us of every run
for ((r = 1; r <= reps; r++)); do
  for setting in none cma; do
    OMPI_MCA_btl_vader_single_copy_mechanism=$setting tools/mpirun.sh -n "$ranks" "$tessera" bench comm \
      --algorithms mpi,ring --backends mpi --sizes "$sizes" --iters "$iters" --csv "$work/run.csv" \
      >"$work/run.out" 2>&1 || { cat "$work/run.out" >&2; exit 1; }
    awk -F, -v s="$setting" 'NR > 1 { print s "," $1 "," $4 "," $5 }' "$work/run.csv" >>"$work/all.csv"
    echo "choose_transport: run $r of $reps, $setting: done" >&2
  done
done

# Medians per (algorithm, bytes) and setting, side by side; then the geometric mean of cma / none.
sort -t, -k4,4g "$work/all.csv" | awk -F, -v summary="$work/ratio" '
  { key = $2 "," $3; k = key SUBSEP $1; t[k, ++n[k]] = $4; keys[key] = 1 }
  function median(k,   c) { c = n[k]; return c % 2 ? t[k, (c + 1) / 2] : (t[k, c / 2] + t[k, c / 2 + 1]) / 2 }
  END {
    for (key in keys) {
      split(key, f, ",")
      a = median(key SUBSEP "none"); b = median(key SUBSEP "cma")
      printf "%-6s %12d %14.1f %14.1f %10.3f\n", f[1], f[2], a, b, b / a
      logsum += log(b / a); rows++
    }
    printf "%.3f\n", exp(logsum / rows) > summary
  }' | sort -k1,1 -k2,2n >"$work/table.txt"
printf "%-6s %12s %14s %14s %10s\n" algo bytes none_us cma_us cma/none
cat "$work/table.txt"
ratio=$(cat "$work/ratio")
choice=$(awk -v r="$ratio" 'BEGIN { print (r < 0.97 ? "cma" : "none") }')
cpu=$(grep -m 1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)
echo "choose_transport: $choice (cma/none = $ratio; cma only where at least 3% faster) on $cpu"
((dry_run)) && exit 0
mkdir -p "$(dirname "$out")"
{
  echo "# tools/choose_transport.sh, $(date -u +%Y-%m-%dT%H:%MZ): geomean time cma/none = $ratio"
  echo "# over mpi and ring, $sizes, $ranks ranks, median of $reps runs; read by tools/mpirun.sh"
  echo "cpu=$cpu"
  echo "OMPI_MCA_btl_vader_single_copy_mechanism=$choice"
} >"$out.tmp"
mv "$out.tmp" "$out"
echo "choose_transport: wrote $out"
