# Sourced by tools/setup.sh and tests/fuzz/run_fuzzers.sh: sets the array ccache_launcher to the
# CMake arguments that put ccache in front of the C and C++ compilers (empty where ccache is
# missing or TESSERA_CCACHE=0).
#
# Every build on this machine (Release, sanitizers, fuzzing; any clone in any folder) shares one
# cache (ccache's default, ~/.cache/ccache), so CI's fresh clone recompiles only what changed since
# the last build here. Paths are taken relative to the clone (base_dir) and the working directory
# is not hashed, so a clone in another folder hits. The namespace is the CPU's model and flags:
# -march=native makes an object depend on the CPU, which ccache's hash of the command line does not
# see, so a cache filled on one CPU kind is never used on another.
# shellcheck shell=bash
# shellcheck disable=SC2034  # used by the scripts that source this one
ccache_launcher=()
if [[ ${TESSERA_CCACHE:-1} != 0 ]] && command -v ccache >/dev/null; then
  ccache_cpu=$(grep -m1 '^model name' /proc/cpuinfo; grep -m1 '^flags' /proc/cpuinfo)
  ccache_cmd="env;CCACHE_BASEDIR=$PWD;CCACHE_NOHASHDIR=true;CCACHE_NAMESPACE=cpu-$(printf '%s' "$ccache_cpu" | sha1sum | cut -c1-12);CCACHE_MAXSIZE=${TESSERA_CCACHE_SIZE:-12G};ccache"
  ccache_launcher=(-DCMAKE_C_COMPILER_LAUNCHER="$ccache_cmd" -DCMAKE_CXX_COMPILER_LAUNCHER="$ccache_cmd")
fi
