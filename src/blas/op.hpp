#pragma once
// The transpose flag and the batch strides of the BLAS wrappers. Free of Kokkos and CUDA
// headers, so both the Kokkos-side dispatch and the CUDA-side wrappers can include it.
#include <cstdint>

namespace tessera::blas {

enum class Op { N, T };

/// \brief A batch of equally shaped products over two nested indices: item (o, i), o < outer
/// and i < inner, of A starts at A + o * a[0] + i * a[1] elements, likewise B and C (a head of a
/// sample: o the sample, i the head). The items of one operand must not overlap (oneDNN describes
/// no such layout). The default is one product.
struct Batch {
  int outer = 1, inner = 1;
  std::int64_t a[2] = {0, 0}, b[2] = {0, 0}, c[2] = {0, 0};
};

}  // namespace tessera::blas
