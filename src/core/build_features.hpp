#pragma once
// What this binary was built with, as constants: the build system's definitions are read here
// and nowhere else, so code branches on ordinary booleans.
namespace tessera::build {

/// The CUDA wrappers (cuBLAS GEMM, pinned staging buffers, device copies) are compiled in
/// (-DTESSERA_ENABLE_CUDA=ON).
#if defined(TESSERA_HAVE_CUDA_WRAPPERS)
inline constexpr bool cuda = true;
#else
inline constexpr bool cuda = false;
#endif

/// The NCCL communicator is compiled in (CUDA wrappers on and CMake found NCCL).
#if defined(TESSERA_HAVE_NCCL)
inline constexpr bool nccl = true;
#else
inline constexpr bool nccl = false;
#endif

/// oneDNN's matmul is compiled in (-DTESSERA_ENABLE_ONEDNN=ON, the default).
#if defined(TESSERA_HAVE_ONEDNN)
inline constexpr bool onednn = true;
#else
inline constexpr bool onednn = false;
#endif

}  // namespace tessera::build
