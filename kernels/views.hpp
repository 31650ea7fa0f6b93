#pragma once
// View aliases used by every kernel and layer. Data lives in the default execution space's
// memory; host mirrors appear only at the I/O and logging boundary.
#include <Kokkos_Core.hpp>

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
