#include "comm/parameter_server.hpp"

#include <algorithm>
#include <climits>

#include "comm/mpi_check.hpp"
#include "comm/mpi_type.hpp"

namespace tessera {

namespace {

constexpr int kServerTag = 0x7e56;
constexpr std::size_t kMaxCount = static_cast<std::size_t>(INT_MAX);

std::size_t clamp_segment(std::size_t segment) { return std::clamp<std::size_t>(segment, 1, kMaxCount); }

/// Rank 0: receive segment k of every other rank in rank order and add it, with the next
/// (segment, rank) message already posted into the other half of scratch.
template <class T>
void gather_and_sum(T* data, std::size_t n, int p, MPI_Comm comm, std::size_t segment, T* scratch) {
  const MPI_Datatype type = mpi_type<T>();
  const std::size_t nseg = (n + segment - 1) / segment;
  const std::size_t messages = nseg * static_cast<std::size_t>(p - 1);
  auto seg_len = [&](std::size_t j) { return static_cast<int>(std::min(segment, n - (j / (p - 1)) * segment)); };
  auto source = [&](std::size_t j) { return 1 + static_cast<int>(j % (p - 1)); };
  MPI_Request req[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
  auto post = [&](std::size_t j) {
    if (j < messages)
      MPI_CHECK(MPI_Irecv(scratch + (j % 2) * segment, seg_len(j), type, source(j), kServerTag, comm,
                          &req[j % 2]));
  };
  // Message j is segment j / (p-1) of rank 1 + j % (p-1): segments in order, ranks in order.
  post(0);
  for (std::size_t j = 0; j < messages; ++j) {
    post(j + 1);
    MPI_CHECK(MPI_Wait(&req[j % 2], MPI_STATUS_IGNORE));
    const T* in = scratch + (j % 2) * segment;
    T* out = data + (j / (p - 1)) * segment;
    const int len = seg_len(j);
    for (int i = 0; i < len; ++i) out[i] += in[i];
  }
}

}  // namespace

std::size_t parameter_server_scratch(std::size_t n, std::size_t segment) {
  return 2 * std::min(clamp_segment(segment), n);
}

template <class T>
void parameter_server_allreduce_sum(T* data, std::size_t n, MPI_Comm comm, std::size_t segment,
                                    T* scratch) {
  int rank = 0, p = 1;
  MPI_CHECK(MPI_Comm_rank(comm, &rank));
  MPI_CHECK(MPI_Comm_size(comm, &p));
  if (p == 1 || n == 0) return;
  segment = std::min(clamp_segment(segment), n);
  const MPI_Datatype type = mpi_type<T>();
  // Everything to rank 0, which adds in rank order.
  if (rank == 0) {
    gather_and_sum(data, n, p, comm, segment, scratch);
  } else {
    for (std::size_t off = 0; off < n; off += segment)
      MPI_CHECK(MPI_Send(data + off, static_cast<int>(std::min(segment, n - off)), type, 0,
                         kServerTag, comm));
  }
  // The sum back to everyone.
  for (std::size_t off = 0; off < n; off += kMaxCount)
    MPI_CHECK(MPI_Bcast(data + off, static_cast<int>(std::min(kMaxCount, n - off)), type, 0, comm));
}

template void parameter_server_allreduce_sum<float>(float*, std::size_t, MPI_Comm, std::size_t, float*);
template void parameter_server_allreduce_sum<double>(double*, std::size_t, MPI_Comm, std::size_t, double*);

}  // namespace tessera
