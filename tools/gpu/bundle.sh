#!/usr/bin/env bash
# Packs what the CUDA build needs on the lent GPU machine into one archive that travels with the
# device tool's `carry` (docs/gpu.md, "Running on the lent GPU machine"), in three archives under
# gpu-bundle/ (ignored by git): core/tessera-gpu-core.tar.xz (every call), fashion/...-fashion
# (the ctest call), checks/...-checks (the correctness and gpt calls).
# That machine has the NVIDIA driver, glibc, cuBLAS, NCCL and the CUDA runtime (PyTorch's wheels,
# the CUDA toolkit) but no Open MPI, HDF5, OpenBLAS, fmt, CLI11 or toml++. The archive holds:
#   build/          the CUDA build's executables and CTestTestfile.cmake files, at their paths
#                   relative to the build folder (stripped of symbols)
#   bin/            Open MPI's orterun (as mpirun, mpiexec), orted, ompi_info
#   lib/            the ldd closure of all of those and of the MCA components, without glibc's
#                   libraries and those of CUDA the device brings (libcuda, cuBLAS, NCCL), with
#                   the CUDA runtime this was built against (libcudart, 0.7 MB)
#   lib/openmpi3/   Open MPI's MCA components, less those that need UCX, libfabric, PSM or
#                   verbs (absent there; the shared-memory and TCP transports remain)
#   lib/fallback/   libstdc++ and libgcc_s: used there only if the device's are older
#   share/openmpi/, etc/openmpi/, pmix/   help and parameter files (OPAL_*, PMIX_* point here)
#   data/fashion-mnist-idx/  Debian's Fashion-MNIST IDX files, gunzipped (xz packs them 12%
#                   smaller than gzip did); run_on_device.sh gzips them again where the tests
#                   look (/usr/share/datasets/fashion-mnist)
#   data/, ref/     made by tools/gpu/make_references.sh (small data, CPU references)
#   MANIFEST        source root and build folder it was built in, commit, glibc needed, sizes
# All three unpack into one tessera-gpu/ folder.
# Usage: tools/gpu/bundle.sh
# env: CUDA_BUILD (build-cuda), CPU_BUILD (build, for the references), BUNDLE_DIR (gpu-bundle),
#      LIMIT_MIB (56: the device tool takes 64 MiB with the working tree), REFS=keep to reuse the
#      references of an earlier run (BUNDLE_DIR/refs) instead of computing them again.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
top=$(cd "$here/../.." && pwd)
cd "$top"

fail() { echo "bundle: error: $*" >&2; exit 2; }
cuda_build=${CUDA_BUILD:-build-cuda}
bundle_dir=${BUNDLE_DIR:-gpu-bundle}
limit_mib=${LIMIT_MIB:-56}
[[ -x $cuda_build/tessera ]] || fail "$cuda_build/tessera not built (docs/gpu.md: the CUDA build)"
grep -q 'TESSERA_ENABLE_CUDA:BOOL=ON' "$cuda_build/CMakeCache.txt" ||
  fail "$cuda_build is not configured with -DTESSERA_ENABLE_CUDA=ON"
for tool in ldd objdump strip xz; do
  command -v "$tool" > /dev/null || fail "'$tool' missing (apt-get install binutils xz-utils)"
done
ompi_lib=/usr/lib/x86_64-linux-gnu/openmpi/lib
ompi_mca=$ompi_lib/openmpi3
pmix_root=/usr/lib/x86_64-linux-gnu/pmix2
[[ -d $ompi_mca && -d $pmix_root ]] || fail "Debian's Open MPI 4.1 ($ompi_mca) or PMIx ($pmix_root) missing"

mkdir -p "$bundle_dir"
bundle_dir=$(cd "$bundle_dir" && pwd)
stage=$(mktemp -d "$bundle_dir/stage.XXXXXX")
trap 'rm -rf "$stage"' EXIT
root=$stage/tessera-gpu
mkdir -p "$root"/{bin,lib/openmpi3,lib/fallback,share,etc,pmix/lib,pmix/share,build,data}

# --- The CUDA build's executables and test files ----------------------------------------------
# Every executable ELF file outside CMakeFiles/, and every CTestTestfile.cmake, at its path.
while IFS= read -r -d '' f; do
  rel=${f#"$cuda_build"/}
  if [[ $(basename "$f") == CTestTestfile.cmake ]]; then
    mkdir -p "$root/build/$(dirname "$rel")" && cp "$f" "$root/build/$rel"
  elif head -c 4 "$f" | grep -q 'ELF'; then
    mkdir -p "$root/build/$(dirname "$rel")" && strip --strip-unneeded -o "$root/build/$rel" "$f"
  fi
done < <(find "$cuda_build" -path '*/CMakeFiles' -prune -o -type f \( -name CTestTestfile.cmake -o -perm -u+x \) -print0)

# --- Open MPI: launcher, components, help and parameter files ---------------------------------
cp -L /usr/bin/orterun "$root/bin/orterun"
ln -s orterun "$root/bin/mpirun"
ln -s orterun "$root/bin/mpiexec"
cp -L /usr/bin/orted /usr/bin/ompi_info "$root/bin/"
# Components that need libraries of fast networks (absent on one machine) stay behind.
skip='libuc[mpst]|libfabric|libpsm|libibverbs|librdmacm|libefa|liboshmem|libinfinipath|libmca_common_(ucx|ofi|verbs)|libjvm|libcuda'
for c in "$ompi_mca"/*.so; do
  if ! objdump -p "$c" | awk '/NEEDED/ { print $2 }' | grep -Eq "^($skip)"; then cp "$c" "$root/lib/openmpi3/"; fi
done
cp -r /usr/share/openmpi "$root/share/openmpi"
cp -r /etc/openmpi "$root/etc/openmpi"
cp -r "$pmix_root/lib/pmix" "$root/pmix/lib/pmix"
cp -r "$pmix_root/share/pmix" "$root/pmix/share/pmix"
cp "$pmix_root/share/pmix-mca-params.conf" "$root/pmix/share/" 2>/dev/null || true

# --- Shared libraries: the ldd closure ---------------------------------------------------------
# glibc comes from the device (it must match its loader); so do the driver, cuBLAS and NCCL,
# too large to carry (cublasLt alone is 540 MB) and installed there with PyTorch.
device_has='^(linux-vdso|ld-linux-x86-64|libc|libm|libdl|libpthread|librt|libresolv|libutil|libanl|libcuda|libcublas|libcublasLt|libnccl)\.so'
fallback='^(libstdc\+\+|libgcc_s)\.so'
declare -A seen=()
collect() {
  local line name path
  while read -r line; do
    name=${line%% *}
    path=$(awk '{ print $3 }' <<< "$line")
    [[ -n ${seen[$name]:-} || $name =~ $device_has ]] && continue
    [[ $path == /* ]] || fail "$1 needs $name, which ldd cannot find"
    seen[$name]=1
    if [[ $name =~ $fallback ]]; then cp -L "$path" "$root/lib/fallback/$name"; else cp -L "$path" "$root/lib/$name"; fi
  done < <(ldd "$1" | grep '=>')
}
while IFS= read -r -d '' f; do collect "$f"; done < <(find "$root/build" "$root/bin" "$root/lib/openmpi3" "$root/pmix/lib" -type f \( -perm -u+x -o -name '*.so' \) -print0)
chmod -R u+w "$root/lib"
strip --strip-unneeded "$root"/lib/*.so* 2> /dev/null || true
# Open MPI's libraries look for libmpi's siblings through their RUNPATH; LD_LIBRARY_PATH wins.

# --- Data and references -----------------------------------------------------------------------
mkdir -p "$root/data/fashion-mnist-idx"
for f in /usr/share/datasets/fashion-mnist/*-ubyte.gz; do
  gzip -dc "$f" > "$root/data/fashion-mnist-idx/$(basename "$f" .gz)"
done
if [[ ${REFS:-} != keep || ! -d $bundle_dir/refs/ref ]]; then
  rm -rf "$bundle_dir/refs"
  "$here/make_references.sh" "$bundle_dir/refs"
fi
cp -r "$bundle_dir/refs/data/." "$root/data/"
cp -r "$bundle_dir/refs/ref" "$root/ref"

# --- Manifest ------------------------------------------------------------------------------------
# The newest glibc and libstdc++ symbol versions any bundled file needs (objdump fails on the
# files that are not ELF: ignored).
versions=$(find "$root" -type f \( -name '*.so*' -o -perm -u+x \) -exec objdump -T {} + 2> /dev/null || true)
glibc=$(grep -o 'GLIBC_[0-9.]*' <<< "$versions" | sort -uV | tail -n 1)
glibcxx=$(grep -o 'GLIBCXX_[0-9.]*' <<< "$versions" | sort -uV | tail -n 1)
{
  echo "source_root=$top"
  echo "build_dir=$cuda_build"
  echo "commit=$(git rev-parse HEAD)$(git diff --quiet HEAD || echo '+changes')"
  echo "made=$(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -n)"
  echo "kokkos=$(grep -m1 '^Kokkos_DIR' "$cuda_build/CMakeCache.txt" | cut -d= -f2)"
  echo "glibc_needed=$glibc"
  echo "glibcxx_needed=$glibcxx"
  # Files that need a glibc newer than Ubuntu 22.04's (2.35): they fail on an older machine.
  echo "glibc_2.36_needed_by=$(find "$root" -type f \( -name '*.so*' -o -perm -u+x \) -print0 |
    xargs -0 -I{} sh -c 'objdump -T "{}" 2> /dev/null | grep -q "GLIBC_2\.3[6-9]" && basename "{}"' | sort -u | tr '\n' ' ')"
  echo "libs=$(cd "$root/lib" && find . -maxdepth 2 -name '*.so*' | wc -l)"
  echo "device_libs=libcuda.so.1 libcublas.so.13 libcublasLt.so.13 libnccl.so.2"
} > "$root/MANIFEST"
(cd "$root" && du -sk build bin lib data ref share etc pmix) | awk '{ printf "size_%s_kib=%s\n", $2, $1 }' >> "$root/MANIFEST"

# --- Archives ------------------------------------------------------------------------------------
# Three, so that a device call carries only what its steps read (each under its own folder of
# BUNDLE_DIR, the unit `carry` takes): core/ (binaries, libraries, Open MPI; every call),
# fashion/ (the IDX files; ctest), checks/ (the small data and the references; correctness, gpt).
# The executables share most of their bytes (each links all of Tessera and its sm_90 kernels,
# about 10 MB stripped): a dictionary of 256 MiB lets xz store most of them as little more than
# their differences from the ones before (about 3 GB of memory here, 256 MiB to unpack).
pack() {
  local name=$1 out=$bundle_dir/$1/$2
  shift 2
  mkdir -p "$(dirname "$out")"
  tar -C "$stage" --sort=name --owner=0 --group=0 -cf - "$@" |
    nice -n 15 xz -T 1 --lzma2=preset=9e,dict=256MiB > "$out.tmp"
  mv "$out.tmp" "$out"
  printf 'bundle: %s: %.1f MiB\n' "$out" "$(awk -v s="$(stat -c %s "$out")" 'BEGIN { print s / 1048576 }')"
}
rm -rf "$bundle_dir/core" "$bundle_dir/fashion" "$bundle_dir/checks" "$bundle_dir/tessera-gpu.tar.xz"
cat "$root/MANIFEST"
pack core tessera-gpu-core.tar.xz --exclude=tessera-gpu/data --exclude=tessera-gpu/ref tessera-gpu
pack fashion tessera-gpu-fashion.tar.xz tessera-gpu/data/fashion-mnist-idx
pack checks tessera-gpu-checks.tar.xz --exclude=tessera-gpu/data/fashion-mnist-idx tessera-gpu/data tessera-gpu/ref
mib() { du -cm "$@" | tail -n 1 | cut -f1; }
with_fashion=$(mib "$bundle_dir"/core/*.xz "$bundle_dir"/fashion/*.xz)
with_checks=$(mib "$bundle_dir"/core/*.xz "$bundle_dir"/checks/*.xz)
worst=$((with_fashion > with_checks ? with_fashion : with_checks))
echo "bundle: the larger carry (core with fashion, or core with checks) is $worst MiB; the limit here is $limit_mib MiB"
((worst <= limit_mib)) || fail "a device call would carry more than $limit_mib MiB"
