#pragma once
// Measured memory per rank, by what the bytes are for. Every Kokkos allocation whose label starts
// with a category tag ("[param] ...", "[grad] ...") is counted through Kokkos's own allocation
// callbacks, so the numbers are what the program holds, not an estimate: current and peak bytes
// per category, on any memory space.
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace tessera::mem {

/// lib: the working buffers of libraries Tessera calls (oneDNN's scratchpads and the blocked
/// copies its convolutions reorder into), counted by count_external, not by Kokkos.
enum class Category : std::size_t { param, grad, optim, act, comm, data, lib, count };

/// \brief The bytes a Kokkos View of `elements` elements of `element_bytes` bytes each allocates,
/// as the counters count them: Kokkos pads every View's allocation to a multiple of 8 bytes. For
/// a model that says what it allocates (nn::Network::activation_bytes).
inline double view_bytes(double elements, double element_bytes) {
  return std::ceil(elements * element_bytes / 8.0) * 8.0;
}

/// "param", "grad", "optim", "act", "comm", "data", "lib"
std::string_view name(Category c);
/// The label of a Kokkos allocation counted under c: "[grad] what".
std::string label(Category c, std::string_view what);

/// \brief Registers the allocation callbacks with Kokkos (after Kokkos::initialize). Idempotent.
void install_tracking();
bool tracking_installed();

/// \brief Counts bytes allocated (bytes > 0) or freed (< 0) outside Kokkos under c, in the same
/// current, peak and total figures as Kokkos's allocations.
void count_external(Category c, std::int64_t bytes);

/// Bytes held now and the most held at once since the program started.
std::size_t current(Category c);
std::size_t peak(Category c);
/// The most bytes of all categories held at once since the program started.
std::size_t peak_total();
/// \brief The process's resident set at its largest so far (getrusage): the counted bytes plus
/// what nothing counts (the program's and the libraries' code, the MPI runtime, the heap's free
/// space; about 50 MB for a 1-rank run here). 0 where the system does not say.
std::size_t resident_peak();

/// The memory this process's node gives it: the physical memory, or the cgroup's limit where one
/// is set and lower (a Slurm job with --mem), with where the number came from.
struct NodeMemory {
  double bytes = 0;
  std::string source;  ///< "MemTotal", "cgroup memory.max", ...
};
NodeMemory node_memory();

}  // namespace tessera::mem
