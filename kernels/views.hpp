#pragma once
// View aliases used by every kernel and layer. Data lives in the default execution space's
// memory; host mirrors appear only at the I/O and logging boundary.
#include <Kokkos_Core.hpp>
#include <cstdint>
#include <stdexcept>
#include <string>

namespace tessera {

using ExecSpace = Kokkos::DefaultExecutionSpace;
using MemSpace = ExecSpace::memory_space;
using HostSpace = Kokkos::HostSpace;

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
