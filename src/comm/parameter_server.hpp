#pragma once
// Parameter-server allreduce, the baseline whose cost grows with the rank count: every rank sends
// its buffer to rank 0 with point-to-point messages, rank 0 adds them in rank order
// ((x0 + x1) + x2) + ..., and broadcasts the sum back. Messages travel in segments so rank 0
// needs only two segments of scratch and adds one segment while the next one arrives.
// Wire type W as in comm/ring_allreduce.hpp: T, or std::uint16_t for bf16 on float data (rank 0
// adds each bf16 segment into its fp32 sum and broadcasts the sum rounded to bf16, which it keeps
// itself too).
#include <mpi.h>

#include <cstddef>
#include <cstdint>

namespace tessera {

/// \brief Elements of scratch that parameter_server_allreduce_sum needs (two segments).
std::size_t parameter_server_scratch(std::size_t n, std::size_t segment);

/// \brief Sums `n` values of `data` in place over every rank of `comm`, through rank 0.
/// Must be called on every rank of `comm` with the same `n` and `segment`.
/// \param segment  elements per message (at least 1)
/// \param scratch  caller-owned, at least parameter_server_scratch(n, segment) elements on
///                 rank 0, and on every rank where W differs from T; the call allocates nothing
/// \return bytes this rank sent to rank 0 (rank 0's broadcast, n * sizeof(W), not included)
template <class T, class W = T>
std::uint64_t parameter_server_allreduce_sum(T* data, std::size_t n, MPI_Comm comm, std::size_t segment,
                                             W* scratch);

extern template std::uint64_t parameter_server_allreduce_sum<float, float>(float*, std::size_t, MPI_Comm, std::size_t,
                                                                           float*);
extern template std::uint64_t parameter_server_allreduce_sum<double, double>(double*, std::size_t, MPI_Comm,
                                                                             std::size_t, double*);
extern template std::uint64_t parameter_server_allreduce_sum<float, std::uint16_t>(float*, std::size_t, MPI_Comm,
                                                                                   std::size_t, std::uint16_t*);

}  // namespace tessera
