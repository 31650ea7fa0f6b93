#!/usr/bin/env bash
# The host optimizer update (kernels::adamw_step, kernels::sgd_step with momentum 0.9) against
# PyTorch's CPU optimizers and the machine's memory bandwidth, in one sitting
# (docs/performance.md, "Host optimizer update").
#
# Each of ROUNDS rounds runs, one after the other:
#   - build/bench/optimizer_update on 1 rank and on 2 ranks (tools/mpirun.sh; each rank updates
#     its half, as ZeRO splits the update; Debian's Kokkos is Serial, one thread per rank): the
#     eight variants (adamw and sgd x grad_factor 1 or 0.5 x bf16 copies or not) and the
#     yardsticks (triad; streams_4r3w and streams_3r2w, the updates' own arrays with no arithmetic);
#   - where KOKKOS_OPENMP_ROOT names an installed OpenMP Kokkos, the same program built against it
#     (in OMP_BUILD_DIR, the target alone) on 1 rank with OMP_NUM_THREADS = 1 and 2;
#   - bench/optimizer_torch.py (PyPI's torch from bench/peer_venv.sh) with 1 and 2 threads, the
#     elements in one tensor and in each count of TENSORS.
# Every program takes the median of REPS samples after WARMUP; the table takes the median over the
# rounds. Traffic counted per element: AdamW 28 bytes, SGD 20, +2 for the bf16 copies (see
# optimizer_update.cpp), for PyTorch the same whatever its implementation moves.
#
# Writes bench/results/optimizer_update[_LABEL].csv (round,program,kernel,variant,elements,
# tensors,ranks,threads,seconds,gelem_per_s,gb_per_s), _sitting.txt (date, CPU, load averages
# at the start and the end) and .md (the tables).
#
# Usage: bench/optimizer_update.sh
# env: ROUNDS (3), REPS (7), WARMUP (2), SIZES (1M,16M,64M), TENSORS ("100"), BUILD_DIR (build),
#      KOKKOS_OPENMP_ROOT (unset: no OpenMP rows), OMP_BUILD_DIR (build-kokkos-openmp), LABEL,
#      TABLE_ONLY=1 (rewrite the .md from the CSV)
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$here/lib.sh"
top=$(cd "$here/.." && pwd)
cd "$top"

rounds=${ROUNDS:-3}
reps=${REPS:-7}
warmup=${WARMUP:-2}
sizes=${SIZES:-1M,16M,64M}
read -r -a tensor_counts <<<"${TENSORS:-100}"
build=${BUILD_DIR:-build}
omp_build=${OMP_BUILD_DIR:-build-kokkos-openmp}
results=bench/results
logs=$results/logs
name=optimizer_update${LABEL:+_$LABEL}
csv=$results/$name.csv
sitting=$results/${name}_sitting.txt
md=$results/$name.md

[[ "$rounds" =~ ^[1-9][0-9]*$ ]] || die "ROUNDS='$rounds' is not a positive integer"
[[ "$reps" =~ ^[1-9][0-9]*$ ]] || die "REPS='$reps' is not a positive integer"
[[ "$warmup" =~ ^[0-9]+$ ]] || die "WARMUP='$warmup' is not a non-negative integer"
[[ "${LABEL:-x}" =~ ^[A-Za-z0-9_.-]+$ ]] || die "LABEL='$LABEL': letters, digits, '.', '_' and '-' only"
mkdir -p "$logs"

if [[ -z "${TABLE_ONLY:-}" ]]; then
  have_pypi_peer || die "no PyTorch in $PYPI_PEER_PYTHON" "run bench/peer_venv.sh (a current torch from PyPI into .venv)"
  cmake --build "$build" --target optimizer_update -j 2 >"$logs/${name}_build.log" 2>&1 ||
    die "building optimizer_update in $build failed; see $logs/${name}_build.log" "configure first: tools/setup.sh $build"
  omp=""
  if [[ -n "${KOKKOS_OPENMP_ROOT:-}" ]]; then
    # shellcheck source-path=SCRIPTDIR source=../tools/ccache.sh
    source tools/ccache.sh
    { cmake -S . -B "$omp_build" -DCMAKE_BUILD_TYPE=Release -DKokkos_ROOT="$KOKKOS_OPENMP_ROOT" \
        -DTESSERA_ENABLE_CUDA=OFF -DTESSERA_ENABLE_TESTS=OFF "${ccache_launcher[@]}" &&
      cmake --build "$omp_build" --target optimizer_update -j 2; } >"$logs/${name}_omp_build.log" 2>&1 ||
      die "building optimizer_update against $KOKKOS_OPENMP_ROOT failed; see $logs/${name}_omp_build.log"
    grep -q 'Kokkos: package config' "$logs/${name}_omp_build.log" ||
      die "$omp_build did not take the Kokkos in $KOKKOS_OPENMP_ROOT; see $logs/${name}_omp_build.log"
    omp=$omp_build/bench/optimizer_update
  fi

  # The sitting: date, CPU, load averages at its start (and, below, at its end).
  {
    date -u +%F
    lscpu | sed -n 's/^Model name: *//p; s/^CPU family: *//p; s/^Model: *//p' | paste -sd'|'
    grep -m 1 '^flags' /proc/cpuinfo | grep -o -w -E 'avx2|avx512f|avx512_bf16|amx_bf16|amx_tile' | paste -sd' '
    nproc
    "$PYPI_PEER_PYTHON" -c 'import torch; print(torch.__version__, torch.backends.cpu.get_cpu_capability())'
    cut -d' ' -f1-3 /proc/loadavg
  } >"$sitting"

  echo "round,program,kernel,variant,elements,tensors,ranks,threads,seconds,gelem_per_s,gb_per_s" >"$csv"
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  # Tessera's CSV (kernel,variant,elements,ranks,threads_per_rank,host_space,bytes,seconds,gelem,gb)
  # as rows of the sitting's CSV.
  tessera_rows() {
    tail -n +2 "$2" | awk -F, -v r="$1" -v prog="$3" 'BEGIN {OFS=","} {print r, prog, $1, $2, $3, 1, $4, $4 * $5, $8, $9, $10}' >>"$csv"
  }
  for ((round = 1; round <= rounds; ++round)); do
    for ranks in 1 2; do
      echo "round $round: tessera, $ranks rank(s)"
      tools/mpirun.sh -n "$ranks" "$build/bench/optimizer_update" --sizes "$sizes" --reps "$reps" --warmup "$warmup" \
        --csv "$tmp/t.csv" >"$logs/${name}_tessera_np${ranks}_r$round.log" 2>&1 ||
        die "optimizer_update on $ranks rank(s) failed; see $logs/${name}_tessera_np${ranks}_r$round.log"
      tessera_rows "$round" "$tmp/t.csv" tessera
    done
    if [[ -n "$omp" ]]; then
      for threads in 1 2; do
        echo "round $round: tessera, OpenMP Kokkos, $threads thread(s)"
        OMP_NUM_THREADS=$threads OMP_PROC_BIND=spread OMP_PLACES=cores tools/mpirun.sh -n 1 "$omp" --sizes "$sizes" \
          --reps "$reps" --warmup "$warmup" --csv "$tmp/t.csv" >"$logs/${name}_openmp_t${threads}_r$round.log" 2>&1 ||
          die "optimizer_update (OpenMP) on $threads thread(s) failed; see $logs/${name}_openmp_t${threads}_r$round.log"
        tessera_rows "$round" "$tmp/t.csv" tessera_openmp
      done
    fi
    for threads in 1 2; do
      for tensors in 1 "${tensor_counts[@]}"; do
        echo "round $round: torch, $threads thread(s), $tensors tensor(s)"
        "$PYPI_PEER_PYTHON" bench/optimizer_torch.py --threads "$threads" --tensors "$tensors" --sizes "$sizes" \
          --reps "$reps" --warmup "$warmup" --csv "$tmp/p.csv" >"$logs/${name}_torch_t${threads}_x${tensors}_r$round.log" 2>&1 ||
          die "optimizer_torch.py failed; see $logs/${name}_torch_t${threads}_x${tensors}_r$round.log"
        # peer,torch,capability,kernel,impl,elements,tensors,threads,seconds,gelem,gb
        tail -n +2 "$tmp/p.csv" | awk -F, -v r="$round" 'BEGIN {OFS=","} {print r, "torch", $4, $5, $6, $7, 1, $8, $9, $10, $11}' >>"$csv"
      done
    done
  done
  cut -d' ' -f1-3 /proc/loadavg >>"$sitting"
fi

"$PEER_PYTHON" - "$csv" "$sitting" "$md" <<'PY'
import csv, statistics, sys
from collections import defaultdict

csv_path, sitting_path, md_path = sys.argv[1:4]
lines = open(sitting_path).read().splitlines() + ["?"] * 7
day, cpu, isa, cores, torch_v, load0, load1 = lines[:7]
runs = defaultdict(list)
for r in csv.DictReader(open(csv_path)):
    key = (r["program"], r["kernel"], r["variant"], int(r["elements"]), int(r["tensors"]), int(r["threads"]))
    runs[key].append(float(r["gb_per_s"]))
gb = {k: statistics.median(v) for k, v in runs.items()}
nrounds = max(len(v) for v in runs.values())
sizes = sorted({k[3] for k in gb})
programs = sorted({k[0] for k in gb if k[0] != "torch"})
threads = sorted({k[5] for k in gb})
tensors = sorted({k[4] for k in gb if k[0] == "torch" and k[4] > 1})
label = {"tessera": "Tessera, ranks x 1 Serial thread", "tessera_openmp": "Tessera, 1 rank x OpenMP threads"}

def mib(n):
    return f"{n // (1 << 20)}M" if n % (1 << 20) == 0 else str(n)

def f(x, d=2):
    return "-" if x is None else f"{x:.{d}f}"

out = [f"# Host optimizer update, {day}", "",
       f"CPU: {cpu} (model name|family|model), {cores} cores, {isa}; torch {torch_v}. "
       f"Load averages {load0} at the start, {load1} at the end. Medians over {nrounds} round(s) of each "
       "program's median. GB/s of counted traffic: AdamW 28 bytes per element, SGD 20, +2 with the bf16 copies; "
       "the yardsticks streams_4r3w (28) and streams_3r2w (20) move the updates' own arrays with no arithmetic, "
       "triad counts 12 (STREAM's count).", ""]
for kernel, streams in (("adamw", "streams_4r3w"), ("sgd", "streams_3r2w")):
    out += [f"## {kernel}: GB/s", "",
            "| elements | cores | " + " | ".join(label[p] for p in programs) +
            " | torch fused | torch foreach | torch forloop | Tessera / torch best | " + streams +
            " | Tessera / " + streams + " | triad | Tessera / triad |",
            "| ---: | ---: |" + " ---: |" * (len(programs) + 8)]
    for n in sizes:
        for t in threads:
            ours = {p: gb.get((p, kernel, "plain", n, 1, t)) for p in programs}
            peer = {i: gb.get(("torch", kernel, i, n, 1, t)) for i in ("fused", "foreach", "forloop")}
            best_ours = max([x for x in ours.values() if x is not None], default=None)
            best_peer = max([x for x in peer.values() if x is not None], default=None)
            yard = max([x for x in (gb.get((p, streams, "yardstick", n, 1, t)) for p in programs) if x], default=None)
            triad = max([x for x in (gb.get((p, "triad", "yardstick", n, 1, t)) for p in programs) if x], default=None)
            ratio = lambda a, b: None if a is None or not b else a / b
            out.append(f"| {mib(n)} | {t} | " + " | ".join(f(ours[p]) for p in programs) + " | " +
                       " | ".join(f(peer[i]) for i in ("fused", "foreach", "forloop")) +
                       f" | **{f(ratio(best_ours, best_peer))}** | {f(yard)} | {f(ratio(best_ours, yard))} | {f(triad)} | "
                       f"{f(ratio(best_ours, triad))} |")
    out.append("")
out += ["## Tessera's variants: GB/s (and the share of the plain update's elements/s)", "",
        "| program | kernel | elements | cores | plain | grad_factor | plain+bf16 | grad_factor+bf16 |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
for p in programs:
    for kernel in ("adamw", "sgd"):
        for n in sizes:
            for t in threads:
                base = gb.get((p, kernel, "plain", n, 1, t))
                if base is None:
                    continue
                cells = []
                for v, extra in (("plain", 0), ("grad_factor", 0), ("plain+bf16", 2), ("grad_factor+bf16", 2)):
                    x = gb.get((p, kernel, v, n, 1, t))
                    base_bytes = 28 if kernel == "adamw" else 20
                    share = None if x is None else x / (base_bytes + extra) / (base / base_bytes)
                    cells.append(f"{f(x)} ({f(share)})")
                out.append(f"| {p} | {kernel} | {mib(n)} | {t} | " + " | ".join(cells) + " |")
out.append("")
if tensors:
    out += ["## torch: one tensor against many (GB/s)", "",
            "| kernel | impl | elements | threads | 1 tensor | " + " | ".join(f"{k} tensors" for k in tensors) + " |",
            "| --- | --- | ---: | ---: | ---: |" + " ---: |" * len(tensors)]
    for kernel in ("adamw", "sgd"):
        for impl in ("fused", "foreach", "forloop"):
            for n in sizes:
                for t in threads:
                    one = gb.get(("torch", kernel, impl, n, 1, t))
                    if one is None:
                        continue
                    out.append(f"| {kernel} | {impl} | {mib(n)} | {t} | {f(one)} | " +
                               " | ".join(f(gb.get(("torch", kernel, impl, n, k, t))) for k in tensors) + " |")
    out.append("")
open(md_path, "w").write("\n".join(out))
print("\n".join(out))
PY
echo "wrote $csv, $md"
