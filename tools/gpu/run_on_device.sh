#!/usr/bin/env bash
# Runs the GPU work on the lent GPU machine from the bundle of tools/gpu/bundle.sh (carried as
# gpu-bundle/); docs/gpu.md gives the device-tool calls. Each step writes its log, and its
# results, under $OUT (the device tool's output folder; here: gpu-out/ in the repository).
#   tools/gpu/run_on_device.sh STEP...
# Steps:
#   info         the machine, the GPU, glibc and the libraries the binaries resolve (info.log)
#   ctest        the CUDA build's test suite on the one GPU, multi-rank tests with their ranks
#                sharing it (ctest.log); labels slurm and lint need Slurm and shellcheck, which
#                are not there, and are left out, and so is the test of the default corpus
#                (Debian's `bible`); the tests' /usr/bin/python3 is the machine's python3
#   correctness  the MLP, CNN and GPT decks of tools/gpu/lib.sh: 30 fp32 losses on 1 rank against
#                the CPU build's (the bundle's ref/), 2 ranks against 1, the CPU's step-15
#                checkpoint resumed here; the GPU's step-15 checkpoints come back in
#                gpu-checkpoints.tar for tools/gpu/resume_returned.sh (correctness.log, .csv)
#   bench-comm   `tessera bench comm` on 2 ranks sharing the GPU (bench-comm.log with the CSV)
#   gpt          a GPT-2-small-shaped model (12 layers, 12 heads, width 768, context 1024, byte
#                vocabulary): Tessera's tokens/s and MFU against 989 TFLOP/s in bf16 and fp32,
#                beside the same model in the machine's PyTorch (bf16 autocast, SDPA), eager and
#                under torch.compile (gpt.log, gpt.csv)
#   all          all of the above in this order (more than one device call's 10 minutes)
# env: OUT, BUNDLE (the folder of tools/gpu/bundle.sh's archives: gpu-bundle), UNPACK
#      (/tmp/tessera-gpu), CTEST_JOBS (12),
#      CTEST_ARGS (extra ctest arguments, e.g. "-R test_gpt"), GPT_BATCH (8), GPT_STEPS (30),
#      GPT_LAYERS (12), GPT_HEADS (12), GPT_WIDTH (768), GPT_CONTEXT (1024),
#      GPT_PRECISIONS ("bf16 fp32": Tessera's rows), TORCH_VARIANTS ("eager compile"; "none"),
#      STEP_TIMEOUT (540 seconds per long command), TESSERA_BINARY (the tessera the steps run; set
#      it to the CPU build's, and TORCH_DEVICE=cpu, to try the steps out on a machine without a GPU)
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
top=$(cd "$here/../.." && pwd)
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$here/lib.sh"
cd "$top" || exit 2

OUT=${OUT:-$top/gpu-out}
mkdir -p "$OUT"
bundle=${BUNDLE:-$top/gpu-bundle}
unpack=${UNPACK:-/tmp/tessera-gpu}
B=$unpack/tessera-gpu
work=$unpack/work
step_timeout=${STEP_TIMEOUT:-540}

die() { echo "run_on_device: error: $*" >&2; exit 2; }
# PyTorch runs with the machine's own libraries: without the bundle's in front of them.
machine_env=(env -u LD_LIBRARY_PATH)
[[ -n ${LD_LIBRARY_PATH:-} ]] && machine_env+=("LD_LIBRARY_PATH=$LD_LIBRARY_PATH")
manifest() { sed -n "s/^$1=//p" "$B/MANIFEST"; }

# \brief Unpack the archives of the bundle that this call carried, each once per machine:
# gpu-bundle/core (always), fashion (ctest), checks (correctness, gpt).
unpack_bundle() {
  local part archive
  mkdir -p "$unpack"
  for part in core fashion checks; do
    archive=$bundle/$part/tessera-gpu-$part.tar.xz
    [[ -f $archive && ! -f $unpack/.unpacked-$part ]] || continue
    if command -v xz > /dev/null; then
      xz -dc "$archive" | tar -x -C "$unpack" || die "cannot unpack $archive"
    else
      python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' "$archive" "$unpack" ||
        die "cannot unpack $archive"
    fi
    touch "$unpack/.unpacked-$part"
  done
  [[ -f $B/MANIFEST ]] || die "$bundle/core/tessera-gpu-core.tar.xz missing: make it with tools/gpu/bundle.sh and carry gpu-bundle/core"
}

# \brief Fail unless the call carried part $1 of the bundle, which step $2 reads.
need_part() {
  [[ -f $unpack/.unpacked-$1 ]] || die "step $2 needs gpu-bundle/$1: add it to the call's carry"
}

# \brief The folder holding library $1 on this machine: the loader's cache, the CUDA toolkit,
# then the NVIDIA wheels of the Python that has PyTorch.
find_lib_dir() {
  local name=$1 path dir
  path=$(ldconfig -p 2> /dev/null | awk -v n="$name" '$1 == n { print $NF; exit }')
  if [[ -z $path ]]; then
    for dir in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib /usr/local/cuda/lib \
        $(python3 -c 'import site; print(" ".join(site.getsitepackages()))' 2> /dev/null); do
      [[ -d $dir ]] || continue
      path=$(find "$dir" -name "$name" -print -quit 2> /dev/null)
      [[ -n $path ]] && break
    done
  fi
  [[ -n $path ]] && dirname "$path"
}

# \brief Paths for the bundle's binaries: the source root and the build folder where the build
# expects them, the Fashion-MNIST folder the tests read, libraries, Open MPI and PMIx.
setup() {
  unpack_bundle
  local src build dirs=() name dir need have
  src=$(manifest source_root)
  build=$(manifest build_dir)
  # The binaries name files under the source root they were built in: make that path this checkout.
  if [[ $(readlink -f "$src") != "$(readlink -f "$top")" ]]; then
    [[ -e $src || -L $src ]] && die "$src exists and is not this checkout; the bundle expects its source there"
    if ! mkdir -p "$(dirname "$src")" || ! ln -s "$top" "$src"; then die "cannot link $src to $top"; fi
  fi
  if [[ ! -e $top/$build ]]; then
    ln -s "$B/build" "$top/$build"
  elif [[ $(readlink -f "$top/$build") != "$(readlink -f "$B/build")" ]]; then
    die "$top/$build exists and is not the bundle's build"
  fi
  # The tests read Debian's Fashion-MNIST folder: gzipped IDX files.
  if [[ -f $unpack/.unpacked-fashion && ! -e /usr/share/datasets/fashion-mnist ]]; then
    if [[ ! -d $B/data/fashion-mnist ]]; then
      mkdir -p "$B/data/fashion-mnist.tmp"
      for f in "$B"/data/fashion-mnist-idx/*-ubyte; do gzip -c "$f" > "$B/data/fashion-mnist.tmp/$(basename "$f").gz"; done
      mv "$B/data/fashion-mnist.tmp" "$B/data/fashion-mnist"
    fi
    mkdir -p /usr/share/datasets && ln -s "$B/data/fashion-mnist" /usr/share/datasets/fashion-mnist
  fi
  for name in libcublas.so.13 libcublasLt.so.13 libnccl.so.2; do
    dir=$(find_lib_dir "$name") || die "$name not found on this machine (ldconfig, /usr/local/cuda, Python's nvidia wheels)"
    [[ " ${dirs[*]} " == *" $dir "* ]] || dirs+=("$dir")
  done
  # The driver's libcuda: where the loader does not know it already (a read-only mount).
  if ! ldconfig -p 2> /dev/null | grep -q 'libcuda\.so\.1 '; then
    for dir in /usr/local/nvidia/lib64 /usr/local/nvidia/lib /usr/lib64 /usr/lib/x86_64-linux-gnu; do
      [[ -e $dir/libcuda.so.1 ]] && { dirs+=("$dir"); break; }
    done
  fi
  # Debian's libstdc++ only where the machine's lacks a symbol version the build needs.
  need=$(manifest glibcxx_needed)
  have=$(find_lib_dir libstdc++.so.6)
  if [[ -z $have ]] || ! grep -qa "$need" "$have/libstdc++.so.6"; then dirs+=("$B/lib/fallback"); fi
  LD_LIBRARY_PATH=$B/lib:$(IFS=:; echo "${dirs[*]}")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  export LD_LIBRARY_PATH PATH=$B/bin:$PATH
  export OPAL_PREFIX=$B OPAL_EXEC_PREFIX=$B OPAL_BINDIR=$B/bin OPAL_LIBDIR=$B/lib OPAL_PKGLIBDIR=$B/lib/openmpi3 \
    OPAL_DATAROOTDIR=$B/share OPAL_DATADIR=$B/share OPAL_PKGDATADIR=$B/share/openmpi OPAL_SYSCONFDIR=$B/etc/openmpi
  export PMIX_PREFIX=$B/pmix PMIX_EXEC_PREFIX=$B/pmix PMIX_LIBDIR=$B/pmix/lib PMIX_PKGLIBDIR=$B/pmix/lib/pmix \
    PMIX_DATADIR=$B/pmix/share PMIX_PKGDATADIR=$B/pmix/share/pmix PMIX_SYSCONFDIR=$B/pmix/etc
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 \
    OMPI_MCA_pml=ob1 OMPI_MCA_btl=self,vader,tcp OMPI_MCA_btl_vader_single_copy_mechanism=none \
    OPENBLAS_NUM_THREADS=1
  TESSERA=${TESSERA_BINARY:-$top/$build/tessera}
  mkdir -p "$work"
}

# \brief Run a command with the step's time limit, its output into the log and the terminal.
# \param $1 log file; the rest: the command
logged() {
  local log=$1
  shift
  echo "+ $*" | tee -a "$log"
  timeout "$step_timeout" "$@" 2>&1 | tee -a "$log"
  return "${PIPESTATUS[0]}"
}

step_info() {
  local log=$OUT/info.log f
  : > "$log"
  {
    echo "== $(date -u +%FT%TZ) $(uname -srm)"
    grep -m1 PRETTY_NAME /etc/os-release
    echo "CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2) x $(nproc)"
    ldd --version | head -n 1
    nvidia-smi
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv
    echo "== bundle"
    cat "$B/MANIFEST"
    echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
    echo "== ldd $TESSERA"
    ldd "$TESSERA"
    echo "== unresolved libraries of every bundled executable (none expected)"
    while IFS= read -r -d '' f; do
      ldd "$f" | grep 'not found' | sed "s|^|$f: |"
    done < <(find "$B/build" "$B/bin" -type f -perm -u+x -print0)
    echo "== versions"
    "$TESSERA" --version
    ompi_info | head -n 12
    mpirun -n 2 hostname
    "${machine_env[@]}" python3 -c 'import torch; print("torch", torch.__version__, "CUDA", torch.version.cuda, "NCCL", torch.cuda.nccl.version(), torch.cuda.get_device_name())'
    command -v nvcc > /dev/null && nvcc --version | tail -n 2
    command -v ctest > /dev/null && ctest --version | head -n 1
  } 2>&1 | tee -a "$log"
  logged "$log" "$top/$(manifest build_dir)/tests/test_cuda_link"
}

# \brief Print the command prefix under which the tests find a /usr/bin/python3 with h5py, numpy
# and matplotlib (they read files back with Debian's Python): nothing where it has them; else a
# private mount namespace in which a wrapper around the machine's python3 (PyTorch's environment
# has all three), with the machine's own libraries, stands at /usr/bin/python3.
tests_python_prefix() {
  local py wrapper=$unpack/python3
  /usr/bin/python3 -c 'import h5py, numpy, matplotlib' 2> /dev/null && return 0
  py=$("${machine_env[@]}" python3 -c 'import sys, h5py, numpy, matplotlib; print(sys.executable)' 2> /dev/null) || return 0
  printf '#!/bin/sh\nexec %s "$@"\n' "${machine_env[*]} $py" > "$wrapper"
  chmod +x "$wrapper"
  if [[ -e /usr/bin/python3 ]]; then
    # shellcheck disable=SC2016  # $0 and $@ are the inner shell's
    printf '%s\n' unshare -m sh -c 'mount --bind "$0" /usr/bin/python3 && exec "$@"' "$wrapper"
  else
    ln -s "$wrapper" /usr/bin/python3
  fi
}

step_ctest() {
  local log=$OUT/ctest.log extra=() prefix=()
  : > "$log"
  read -r -a extra <<< "${CTEST_ARGS:-}"
  command -v ctest > /dev/null || die "no ctest on this machine"
  need_part fashion ctest
  mapfile -t prefix < <(tests_python_prefix)
  echo "python3 of the tests: ${prefix[*]:-/usr/bin/python3 as it is}" | tee -a "$log"
  # The default corpus test needs Debian's `bible` (bible-kjv), which is not there.
  logged "$log" env GTEST_FILTER=-PrepareText.CorpusScriptWritesTheWholeKingJamesBible "${prefix[@]}" ctest --test-dir "$top/$(manifest build_dir)" -LE 'slurm|lint' \
    -j "${CTEST_JOBS:-12}" --timeout 400 --output-on-failure "${extra[@]}"
}

# \brief Train deck $1 on $2 ranks into $3 with the CUDA build; more arguments follow.
gpu_train() {
  local name=$1 ranks=$2 out=$3 args
  shift 3
  mapfile -t args < <(gpu_deck_args "$name" "$B/data" "$out")
  timeout "$step_timeout" mpirun -n "$ranks" --bind-to none "$TESSERA" "${args[@]}" "$@" > "$out.log" 2>&1
}

# \brief One row of correctness.csv and of the log: deck, check, the comparison, its verdict.
check_row() {
  local deck=$1 check=$2 ref=$3 got=$4 from=$5 tol=$6 result verdict
  result=$(gpu_compare_losses "$ref" "$got" "$from" "$tol") && verdict=pass || verdict=FAIL
  echo "$deck,$check,$(sed -E 's/steps=([^ ]*) max_rel=([^ ]*) at_step=([^ ]*) missing=([^ ]*)/\1,\2,\3,\4/' <<< "$result"),$tol,$verdict" >> "$OUT/correctness.csv"
  echo "$deck $check: $result tolerance=$tol $verdict" | tee -a "$OUT/correctness.log"
  [[ $verdict == pass ]]
}

step_correctness() {
  local log=$OUT/correctness.log status=0 deck tol w ckpt
  need_part checks correctness
  : > "$log"
  echo "deck,check,steps,max_rel,at_step,missing,tolerance,result" > "$OUT/correctness.csv"
  rm -rf "$work/correctness" && mkdir -p "$work/correctness/checkpoints"
  for deck in "${GPU_DECKS[@]}"; do
    w=$work/correctness/$deck
    mkdir -p "$w"
    tol=$(awk -F, -v d="$deck" '$1 == d { print $4 }' "$B/ref/tolerance.csv")
    ckpt=$(printf 'step_%08d.h5' "$GPU_RESUME_STEP")
    if gpu_train "$deck" 1 "$w/gpu1"; then
      gpu_losses "$w/gpu1" > "$w/gpu1.csv"
      check_row "$deck" gpu1-vs-cpu1 "$B/ref/$deck/losses.csv" "$w/gpu1.csv" 1 "$tol" || status=1
      cp "$w/gpu1/checkpoints/$ckpt" "$work/correctness/checkpoints/${deck}_$ckpt"
      logged "$log" "$TESSERA" diff "$B/ref/$deck/$ckpt" "$w/gpu1/checkpoints/$ckpt" --model-only | tail -n 4
    else
      echo "$deck: the 1-rank GPU run failed:" | tee -a "$log"; tail -n 20 "$w/gpu1.log" | tee -a "$log"; status=1
    fi
    if gpu_train "$deck" 2 "$w/gpu2"; then
      gpu_losses "$w/gpu2" > "$w/gpu2.csv"
      grep -m1 '^comm:' "$w/gpu2/log.txt" | tee -a "$log"
      check_row "$deck" gpu2-vs-gpu1 "$w/gpu1.csv" "$w/gpu2.csv" 1 "$tol" || status=1
    else
      echo "$deck: the 2-rank GPU run failed:" | tee -a "$log"; tail -n 20 "$w/gpu2.log" | tee -a "$log"; status=1
    fi
    if gpu_train "$deck" 1 "$w/resume" --resume "$B/ref/$deck/$ckpt"; then
      gpu_losses "$w/resume" > "$w/resume.csv"
      check_row "$deck" gpu-resumes-cpu "$B/ref/$deck/losses.csv" "$w/resume.csv" $((GPU_RESUME_STEP + 1)) "$tol" || status=1
    else
      echo "$deck: resuming the CPU checkpoint failed:" | tee -a "$log"; tail -n 20 "$w/resume.log" | tee -a "$log"; status=1
    fi
  done
  tar -C "$work/correctness" -cf "$OUT/gpu-checkpoints.tar" checkpoints
  echo "correctness: $( ((status == 0)) && echo 'every check passed' || echo 'SOME CHECKS FAILED')" | tee -a "$log"
  return "$status"
}

step_bench_comm() {
  local log=$OUT/bench-comm.log
  : > "$log"
  logged "$log" mpirun -n 2 --bind-to none "$TESSERA" bench comm --csv "$work/comm_np2.csv"
  echo "== comm_np2.csv" >> "$log"
  cat "$work/comm_np2.csv" >> "$log" 2> /dev/null
}

step_gpt() {
  local log=$OUT/gpt.log csv=$OUT/gpt.csv batch=${GPT_BATCH:-8} steps=${GPT_STEPS:-30} p v out flags
  local L=${GPT_LAYERS:-12} H=${GPT_HEADS:-12} C=${GPT_WIDTH:-768} T=${GPT_CONTEXT:-1024}
  need_part checks gpt
  : > "$log"
  echo "who,layers,heads,width,context,batch,tokens_per_s,median_step_ms,tflops,mfu_percent,max_mem_gib" > "$csv"
  for p in ${GPT_PRECISIONS:-bf16 fp32}; do
    out=$work/gpt-$p
    if logged "$log" mpirun -n 1 --bind-to none "$TESSERA" train inputs/kjv_gpt.toml --set "data.path=\"$B/data/corpus-small.h5\"" \
        --set "model.layers=$L" --set "model.heads=$H" --set "model.width=$C" --set "model.context=$T" \
        --set "train.precision=\"$p\"" --set "train.global_batch=$batch" --set "train.steps=$steps" \
        --set train.log_every=1 --set schedule.warmup_steps=0 --set eval.every_epoch=false \
        --set eval.every_steps=0 --set eval.at_end=false --set checkpoint.every_steps=0 \
        --set checkpoint.at_end=false --set "run.output_dir=\"$out\"" --set run.overwrite=true; then
      # tokens/s: context x the median samples/s of the steps after the 10th; FLOPs as gpt_torch.py.
      python3 - "$out/metrics.csv" "tessera-$p" "$L" "$H" "$C" "$T" "$batch" >> "$csv" <<'PY'
import csv, statistics, sys
who, (L, H, C, T, B) = sys.argv[2], map(int, sys.argv[3:8])
rows = [r for r in csv.DictReader(open(sys.argv[1])) if r['kind'] == 'train' and int(r['step']) > 10]
tps = T * statistics.median(float(r['samples_per_s']) for r in rows)
n = L * (12 * C * C + 13 * C) + 256 * C + 2 * C  # parameters without wpe (the head is tied)
tflops = tps * (6 * n + 12 * L * T * C) / 1e12
print(f"{who},{L},{H},{C},{T},{B},{tps:.0f},{1e3 * B * T / tps:.2f},{tflops:.1f},{100 * tflops / 989:.1f},")
PY
    fi
  done
  for v in ${TORCH_VARIANTS:-eager compile}; do
    [[ $v == none ]] && continue
    flags=(--sdpa --amp bf16)
    [[ $v == compile ]] && flags+=(--compile)
    logged "$log" "${machine_env[@]}" PYTHONUNBUFFERED=1 python3 "$here/gpt_torch.py" --data "$B/data/corpus-small.txt" \
      --layers "$L" --heads "$H" --embd "$C" --block "$T" --batch "$batch" --steps "$steps" "${flags[@]}" \
      --device "${TORCH_DEVICE:-cuda}" --csv "$csv"
  done
  { column -s, -t < "$csv" 2> /dev/null || cat "$csv"; } | tee -a "$log"
}

[[ $# -ge 1 ]] || die "usage: tools/gpu/run_on_device.sh info|ctest|correctness|bench-comm|gpt|all ..."
steps=()
for s in "$@"; do
  case $s in
    all) steps+=(info ctest correctness bench-comm gpt) ;;
    info | ctest | correctness | bench-comm | gpt) steps+=("$s") ;;
    *) die "unknown step '$s' (info, ctest, correctness, bench-comm, gpt, all)" ;;
  esac
done
setup
status=0
for s in "${steps[@]}"; do
  start=$SECONDS
  case $s in
    info) step_info ;;
    ctest) step_ctest ;;
    correctness) step_correctness ;;
    bench-comm) step_bench_comm ;;
    gpt) step_gpt ;;
  esac || status=1
  echo "run_on_device: $s took $((SECONDS - start)) s (status so far $status)" | tee -a "$OUT/$s.log"
done
exit "$status"
