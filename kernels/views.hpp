#pragma once
// View aliases used by every kernel and layer. Data lives in the default execution space's
// memory; host mirrors appear only at the I/O and logging boundary.
#include <Kokkos_Core.hpp>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "kernels/simd.hpp"

namespace tessera {

using ExecSpace = Kokkos::DefaultExecutionSpace;
using MemSpace = ExecSpace::memory_space;
using HostSpace = Kokkos::HostSpace;
/// Host memory a GPU copies to and from asynchronously (page-locked); plain host memory elsewhere.
#if defined(KOKKOS_ENABLE_CUDA)
using PinnedSpace = Kokkos::CudaHostPinnedSpace;
#else
using PinnedSpace = HostSpace;
#endif

template <class T, class Mem = MemSpace>
using Vector = Kokkos::View<T*, Kokkos::LayoutRight, Mem>;

/// Row-major matrix: (rows, cols), rows are samples where a matrix holds a batch.
template <class T, class Mem = MemSpace>
using Matrix = Kokkos::View<T**, Kokkos::LayoutRight, Mem>;

/// Non-owning views over a flat buffer (parameters and gradients are sub-ranges of one buffer).
template <class T, class Mem = MemSpace>
using VectorU = Kokkos::View<T*, Kokkos::LayoutRight, Mem, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
template <class T, class Mem = MemSpace>
using MatrixU = Kokkos::View<T**, Kokkos::LayoutRight, Mem, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;

/// Index type of every flat kernel loop (a parameter buffer may exceed 2^31 elements).
using Index = std::int64_t;

/// The policy of every flat kernel: [0, n) on the given execution-space instance.
inline Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<Index>> range(const ExecSpace& exec, Index n) {
  return Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<Index>>(exec, 0, n);
}

/// \brief f(r, e) for every r < rows and e < cols: how the element-wise kernels walk rows (of a
/// matrix, or of the planes of raw buffers). Host memory: one thread per r with a contiguous,
/// vectorisable loop over e (an MDRange tiles and does not vectorise, and a flat range pays an
/// integer division per element: the U-Net's copies and up-sampling spent more time dividing than
/// moving). A GPU: a 2-D range, one thread per element, coalesced over e. f must carry no
/// dependence from one e to the next (the host loop is marked simd).
template <class F>
void for_rows(const char* name, const ExecSpace& exec, Index rows, Index cols, const F& f) {
  if constexpr (Kokkos::SpaceAccessibility<HostSpace, MemSpace>::accessible) {
    Kokkos::parallel_for(name, range(exec, rows), KOKKOS_LAMBDA(const Index r) {
      TESSERA_SIMD
      for (Index e = 0; e < cols; ++e) f(r, e);
    });
  } else {
    Kokkos::parallel_for(name,
                         Kokkos::MDRangePolicy<ExecSpace, Kokkos::Rank<2>, Kokkos::IndexType<Index>>(
                             exec, {0, 0}, {rows, cols}),
                         f);
  }
}

/// Column sums (bias and LayerNorm parameter gradients) run one thread per block of columns
/// looping over the rows: no atomics, and each column's order fixed (row by row), whatever the
/// block width. On a GPU a block is one column (neighbouring threads read neighbouring
/// columns). On a CPU it is as wide as leaves a block to every thread, from 32 to
/// `column_block_max` columns: wide blocks read each row as one long contiguous run, which the
/// prefetcher follows (the GPT's bias and LayerNorm gradients took 2.4x less time at 1024
/// columns than at 32 on one thread).
inline constexpr Index column_block_max = Kokkos::SpaceAccessibility<HostSpace, MemSpace>::accessible ? 1024 : 1;

/// \brief The width of column_block_max's blocks for `cols` columns on `exec`.
inline Index column_block(const ExecSpace& exec, Index cols) {
  if constexpr (column_block_max == 1) {
    return 1;
  } else {
    const Index threads = exec.concurrency() > 0 ? Index(exec.concurrency()) : 1;
    const Index w = ((cols + threads - 1) / threads + 31) / 32 * 32;
    return w < 32 ? 32 : w > column_block_max ? column_block_max : w;
  }
}

/// A contiguous rank-2 view seen as one flat vector of rows*cols elements, for element-wise
/// kernels. Throws when the view is strided (a column subview).
template <class View>
auto flat(const View& m) {
  static_assert(View::rank == 2, "tessera::flat takes a rank-2 view");
  using T = typename View::value_type;
  using Mem = typename View::memory_space;
  if (!m.span_is_contiguous()) {
    throw std::invalid_argument("tessera::flat: view '" + std::string(m.label()) +
                                "' is not contiguous");
  }
  return VectorU<T, Mem>(m.data(), m.extent(0) * m.extent(1));
}

/// The first n rows of a contiguous rank-2 view, as an unmanaged view (a slot's buffers are
/// sized for the largest batch; a smaller batch uses their first rows).
template <class E, class... P>
MatrixU<E> first_rows(const Kokkos::View<E**, P...>& m, std::size_t n) {
  return MatrixU<E>(m.data(), n, m.extent(1));
}

/// The first n elements of a rank-1 view, as an unmanaged view.
template <class E, class... P>
VectorU<E> first(const Kokkos::View<E*, P...>& v, std::size_t n) {
  return VectorU<E>(v.data(), n);
}

/// Pushes a named region for Kokkos tools for the lifetime of the object (Kokkos 3.4 lacks
/// Kokkos::Profiling::ScopedRegion).
class ScopedRegion {
 public:
  explicit ScopedRegion(const std::string& name) { Kokkos::Profiling::pushRegion(name); }
  ~ScopedRegion() { Kokkos::Profiling::popRegion(); }
  ScopedRegion(const ScopedRegion&) = delete;
  ScopedRegion& operator=(const ScopedRegion&) = delete;
};

}  // namespace tessera
