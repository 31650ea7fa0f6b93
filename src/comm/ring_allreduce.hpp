#pragma once
// Ring allreduce over MPI point-to-point: a reduce-scatter then an allgather around the ring
// (rank r sends to r+1 and receives from r-1). The buffer is cut into one near-equal chunk per
// rank (any length works, also one not divisible by the rank count, also 0); each chunk travels
// in segments so a large message pipelines: the next segment is already in flight while the
// last one is added. Each chunk is reduced along one fixed path and then copied, so every rank
// ends with bitwise the same sums.
#include <mpi.h>

#include <cstddef>

namespace tessera {

/// \brief Elements of scratch that ring_allreduce_sum needs for `n` elements over `ranks`
/// ranks and segments of `segment` elements: two segments, none longer than a chunk.
std::size_t ring_allreduce_scratch(std::size_t n, int ranks, std::size_t segment);

/// \brief Sums `n` values of `data` in place over every rank of `comm`.
/// Must be called on every rank of `comm` with the same `n` and `segment`.
/// \param segment  elements per pipelined message (at least 1)
/// \param scratch  caller-owned, at least ring_allreduce_scratch(n, size, segment) elements;
///                 the call allocates nothing
template <class T>
void ring_allreduce_sum(T* data, std::size_t n, MPI_Comm comm, std::size_t segment, T* scratch);

extern template void ring_allreduce_sum<float>(float*, std::size_t, MPI_Comm, std::size_t, float*);
extern template void ring_allreduce_sum<double>(double*, std::size_t, MPI_Comm, std::size_t, double*);

}  // namespace tessera
