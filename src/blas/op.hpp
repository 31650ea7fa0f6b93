#pragma once
// The transpose flag of the BLAS wrappers. Free of Kokkos and CUDA headers, so both the
// Kokkos-side dispatch and the CUDA-side wrappers can include it.

namespace tessera::blas {

enum class Op { N, T };

}  // namespace tessera::blas
