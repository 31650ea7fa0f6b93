#!/usr/bin/env bash
# Checks here, without a GPU, as far as that goes, that the bundle of tools/gpu/bundle.sh holds
# everything its binaries need (docs/gpu.md records what this proves and what it cannot):
#   1. unpacked into a fresh folder, every bundled executable and library resolves every library
#      it needs, under a clean environment whose LD_LIBRARY_PATH names the bundle only, to a
#      file inside the bundle or to one the GPU machine brings itself (glibc, the driver's
#      libcuda, cuBLAS, NCCL; from /usr/local/cuda here, with the toolkit's stub of libcuda);
#   2. the bundle's ompi_info answers with its own prefix and finds its components there;
#   3. the bundle's mpirun starts 2 ranks of a non-MPI program, and 2 ranks of `tessera
#      --version`, which get through MPI_Init (the bundled Open MPI, PMIx, HDF5 and OpenBLAS
#      load) and stop where Kokkos looks for a GPU: the expected end on a machine without one.
# Usage: tools/gpu/check_bundle.sh [BUNDLE_DIR]   (default gpu-bundle; reads core/)
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
top=$(cd "$here/../.." && pwd)
archive=${1:-$top/gpu-bundle}/core/tessera-gpu-core.tar.xz
fail() { echo "check_bundle: error: $*" >&2; exit 2; }
[[ -f $archive ]] || fail "$archive missing (tools/gpu/bundle.sh)"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
xz -dc "$archive" | tar -x -C "$tmp"
B=$tmp/tessera-gpu
# What the GPU machine brings: here from the CUDA toolkit, libcuda as the toolkit's stub.
mkdir -p "$tmp/device"
ln -s /usr/local/cuda/lib64/stubs/libcuda.so "$tmp/device/libcuda.so.1"
for lib in libcublas.so.13 libcublasLt.so.13 libnccl.so.2; do ln -s "/usr/local/cuda/lib64/$lib" "$tmp/device/$lib"; done
clean=(env -i "HOME=$tmp" "PATH=$B/bin:/usr/bin:/bin" "LD_LIBRARY_PATH=$B/lib:$B/lib/fallback:$tmp/device"
  "OPAL_PREFIX=$B" "OPAL_EXEC_PREFIX=$B" "OPAL_BINDIR=$B/bin" "OPAL_LIBDIR=$B/lib" "OPAL_PKGLIBDIR=$B/lib/openmpi3"
  "OPAL_DATAROOTDIR=$B/share" "OPAL_DATADIR=$B/share" "OPAL_PKGDATADIR=$B/share/openmpi"
  "OPAL_SYSCONFDIR=$B/etc/openmpi" "PMIX_PREFIX=$B/pmix" "PMIX_PKGLIBDIR=$B/pmix/lib/pmix"
  "PMIX_PKGDATADIR=$B/pmix/share/pmix" OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  OMPI_MCA_pml=ob1 "OMPI_MCA_btl=self,vader,tcp" OMPI_MCA_btl_vader_single_copy_mechanism=none)
device_has='^(linux-vdso|ld-linux-x86-64|libc|libm|libdl|libpthread|librt|libresolv|libutil|libanl)\.so'
status=0

echo "== 1. libraries of $(find "$B" -type f \( -perm -u+x -o -name '*.so*' \) | wc -l) bundled files"
outside=0 files=0
while IFS= read -r -d '' f; do
  head -c 4 "$f" | grep -q ELF || continue
  files=$((files + 1))
  while read -r name _ path _; do
    [[ $name =~ $device_has ]] && continue
    if [[ $path == "not" ]]; then echo "$f: $name not found"; outside=$((outside + 1)); continue; fi
    [[ $path == "$B"/* || $path == "$tmp/device"/* ]] && continue
    echo "$f: $name resolves outside the bundle: $path"
    outside=$((outside + 1))
  done < <("${clean[@]}" ldd "$f" 2> /dev/null | grep '=>')
done < <(find "$B" -type f \( -perm -u+x -o -name '*.so*' \) -print0)
echo "$files ELF files; $outside libraries missing or from outside the bundle"
((outside == 0)) || status=1

echo "== 2. ompi_info"
"${clean[@]}" ompi_info --parsable --path prefix --path pkglibdir | tee "$tmp/paths"
grep -q "path:prefix:$B" "$tmp/paths" || { echo "ompi_info does not report the bundle's prefix"; status=1; }
components=$("${clean[@]}" ompi_info | grep -cE 'MCA (btl|pml|coll|plm|ess|odls)')
echo "components it lists: $components"
((components > 10)) || { echo "too few components: the bundle's lib/openmpi3 was not read"; status=1; }

echo "== 3. the bundled mpirun"
"${clean[@]}" mpirun -n 2 --bind-to none hostname || status=1
set +e
"${clean[@]}" mpirun -n 2 --bind-to none "$B/build/tessera" --version > "$tmp/version.log" 2>&1
code=$?
set -e
grep -E 'what\(\)|cudaError' "$tmp/version.log" | sed 's/^/    /' | head -n 6
echo "tessera --version on 2 ranks exited with $code"
if grep -qiE 'error while loading shared libraries|symbol lookup error|undefined symbol' "$tmp/version.log"; then
  echo "the loader failed"
  status=1
fi
# Both ranks got through MPI_Init and stopped where Kokkos asks the (stub) driver for devices.
reached=$(grep -c 'cudaErrorStubLibrary' "$tmp/version.log" || true)
echo "ranks that reached Kokkos's CUDA start-up: $reached of 2"
((reached == 2)) || status=1
echo "check_bundle: $( ((status == 0)) && echo ok || echo FAILED)"
exit "$status"
