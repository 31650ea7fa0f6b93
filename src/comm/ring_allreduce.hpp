#pragma once
// Ring allreduce over MPI point-to-point: a reduce-scatter then an allgather around the ring
// (rank r sends to r+1 and receives from r-1). The buffer is cut into one near-equal chunk per
// rank (any length works, also one not divisible by the rank count, also 0); each chunk travels
// in segments so a large message pipelines: the next segment is already in flight while the
// last one is added. Each chunk is reduced along one fixed path and then copied, so every rank
// ends with bitwise the same sums.
//
// The wire type W is the data's own type T, or std::uint16_t for bf16 on float data
// (comm.reduce_dtype = "bf16", comm/bf16.hpp): each segment is rounded to bf16 before it is sent,
// a received one is added into the fp32 buffer (an fp32 addition), and the allgather first rounds
// the chunk this rank finished, so that every rank ends with the same bf16 values (as floats).
// The caller rounds the inputs (comm::round_to_bf16) where they should count as bf16 values.
//
// The reduce-scatter and the allgather are also callable alone (the hierarchical allreduce runs
// them inside a node). Every call returns the bytes this rank sent (its own messages' payload).
#include <mpi.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>

namespace tessera {

/// Chunk i of n elements over p ranks: the first n % p chunks hold one element more.
struct RingChunks {
  std::size_t n;
  int p;
  std::size_t offset(int i) const {
    const std::size_t base = n / static_cast<std::size_t>(p), extra = n % static_cast<std::size_t>(p);
    const auto ui = static_cast<std::size_t>(i);
    return ui * base + std::min(ui, extra);
  }
  std::size_t length(int i) const {
    return n / static_cast<std::size_t>(p) + (static_cast<std::size_t>(i) < n % static_cast<std::size_t>(p) ? 1 : 0);
  }
};

/// The chunk whose whole sum rank r of p holds after ring_reduce_scatter.
inline int ring_owned_chunk(int r, int p) { return (r + 1) % p; }

/// \brief Elements of W scratch that the ring calls need for `n` elements over `ranks` ranks
/// and segments of `segment` elements: two segments (four where W differs from the data's type:
/// `converting`), none longer than a chunk.
std::size_t ring_allreduce_scratch(std::size_t n, int ranks, std::size_t segment, bool converting = false);

/// \brief Sums `n` values of `data` in place over every rank of `comm`.
/// Must be called on every rank of `comm` with the same `n` and `segment`.
/// \param segment  elements per pipelined message (at least 1)
/// \param scratch  caller-owned, at least ring_allreduce_scratch(n, size, segment, W != T)
///                 elements; the call allocates nothing
/// \return bytes this rank sent
template <class T, class W = T>
std::uint64_t ring_allreduce_sum(T* data, std::size_t n, MPI_Comm comm, std::size_t segment, W* scratch);

/// \brief The first half alone: afterwards chunk ring_owned_chunk(rank, size) of `data` (RingChunks)
/// holds the sum over `comm`; the other chunks hold partial sums. Same parameters.
template <class T, class W = T>
std::uint64_t ring_reduce_scatter(T* data, std::size_t n, MPI_Comm comm, std::size_t segment, W* scratch);

/// \brief The second half alone: each rank's chunk ring_owned_chunk(rank, size) goes to every
/// rank (W = bf16: rounded to bf16 first, on its owner too). Same parameters.
template <class T, class W = T>
std::uint64_t ring_allgather(T* data, std::size_t n, MPI_Comm comm, std::size_t segment, W* scratch);

#define TESSERA_RING_DECLARE(T, W)                                                                    \
  extern template std::uint64_t ring_allreduce_sum<T, W>(T*, std::size_t, MPI_Comm, std::size_t, W*); \
  extern template std::uint64_t ring_reduce_scatter<T, W>(T*, std::size_t, MPI_Comm, std::size_t, W*); \
  extern template std::uint64_t ring_allgather<T, W>(T*, std::size_t, MPI_Comm, std::size_t, W*);
TESSERA_RING_DECLARE(float, float)
TESSERA_RING_DECLARE(double, double)
TESSERA_RING_DECLARE(float, std::uint16_t)
#undef TESSERA_RING_DECLARE

}  // namespace tessera
