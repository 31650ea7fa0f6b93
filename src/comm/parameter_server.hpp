#pragma once
// Parameter-server allreduce, the baseline whose cost grows with the rank count: every rank sends
// its buffer to rank 0 with point-to-point messages, rank 0 adds them in rank order
// ((x0 + x1) + x2) + ..., and broadcasts the sum back. Messages travel in segments so rank 0
// needs only two segments of scratch and adds one segment while the next one arrives.
#include <mpi.h>

#include <cstddef>

namespace tessera {

/// \brief Elements of scratch that parameter_server_allreduce_sum needs (two segments).
std::size_t parameter_server_scratch(std::size_t n, std::size_t segment);

/// \brief Sums `n` values of `data` in place over every rank of `comm`, through rank 0.
/// Must be called on every rank of `comm` with the same `n` and `segment`.
/// \param segment  elements per message (at least 1)
/// \param scratch  caller-owned, at least parameter_server_scratch(n, segment) elements on
///                 rank 0 (unused elsewhere); the call allocates nothing
template <class T>
void parameter_server_allreduce_sum(T* data, std::size_t n, MPI_Comm comm, std::size_t segment,
                                    T* scratch);

extern template void parameter_server_allreduce_sum<float>(float*, std::size_t, MPI_Comm, std::size_t, float*);
extern template void parameter_server_allreduce_sum<double>(double*, std::size_t, MPI_Comm, std::size_t, double*);

}  // namespace tessera
