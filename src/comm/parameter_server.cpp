#include "comm/parameter_server.hpp"

#include <algorithm>
#include <climits>

#include "comm/mpi_check.hpp"
#include "comm/mpi_type.hpp"
#include "comm/wire.hpp"

namespace tessera {

namespace {

constexpr int kServerTag = 0x7e56;
constexpr std::size_t kMaxCount = static_cast<std::size_t>(INT_MAX);

std::size_t clamp_segment(std::size_t segment) { return std::clamp<std::size_t>(segment, 1, kMaxCount); }

/// Rank 0: receive segment k of every other rank in rank order and add it, with the next
/// (segment, rank) message already posted into the other half of scratch.
template <class T, class W>
void gather_and_sum(T* data, std::size_t n, int p, MPI_Comm comm, std::size_t segment, W* scratch) {
  const MPI_Datatype type = mpi_type<W>();
  const std::size_t nseg = (n + segment - 1) / segment;
  const std::size_t messages = nseg * static_cast<std::size_t>(p - 1);
  auto seg_len = [&](std::size_t j) { return std::min(segment, n - (j / (p - 1)) * segment); };
  auto source = [&](std::size_t j) { return 1 + static_cast<int>(j % (p - 1)); };
  MPI_Request req[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
  auto post = [&](std::size_t j) {
    if (j < messages)
      MPI_CHECK(MPI_Irecv(scratch + (j % 2) * segment, static_cast<int>(seg_len(j)), type, source(j), kServerTag,
                          comm, &req[j % 2]));
  };
  // Message j is segment j / (p-1) of rank 1 + j % (p-1): segments in order, ranks in order.
  post(0);
  for (std::size_t j = 0; j < messages; ++j) {
    post(j + 1);
    MPI_CHECK(MPI_Wait(&req[j % 2], MPI_STATUS_IGNORE));
    comm::add_decoded(scratch + (j % 2) * segment, data + (j / (p - 1)) * segment, seg_len(j));
  }
}

/// Rank 0's sum to every rank: as it is (W = T), or segment by segment through scratch as W.
template <class T, class W>
void broadcast_sum(T* data, std::size_t n, int rank, MPI_Comm comm, std::size_t segment, W* scratch) {
  if constexpr (comm::kConverts<T, W>) {
    for (std::size_t off = 0; off < n; off += segment) {
      const std::size_t len = std::min(segment, n - off);
      if (rank == 0) comm::encode(data + off, scratch, len);
      MPI_CHECK(MPI_Bcast(scratch, static_cast<int>(len), mpi_type<W>(), 0, comm));
      comm::decode(scratch, data + off, len);  // rank 0 too: its copy equals everyone's
    }
  } else {
    (void)rank, (void)segment, (void)scratch;
    for (std::size_t off = 0; off < n; off += kMaxCount)
      MPI_CHECK(MPI_Bcast(data + off, static_cast<int>(std::min(kMaxCount, n - off)), mpi_type<T>(), 0, comm));
  }
}

}  // namespace

std::size_t parameter_server_scratch(std::size_t n, std::size_t segment) {
  return 2 * std::min(clamp_segment(segment), n);
}

template <class T, class W>
std::uint64_t parameter_server_allreduce_sum(T* data, std::size_t n, MPI_Comm comm, std::size_t segment,
                                             W* scratch) {
  int rank = 0, p = 1;
  MPI_CHECK(MPI_Comm_rank(comm, &rank));
  MPI_CHECK(MPI_Comm_size(comm, &p));
  if (p == 1 || n == 0) return 0;
  segment = std::min(clamp_segment(segment), n);
  std::uint64_t sent = 0;
  // Everything to rank 0, which adds in rank order.
  if (rank == 0) {
    gather_and_sum(data, n, p, comm, segment, scratch);
  } else {
    for (std::size_t off = 0; off < n; off += segment) {
      const std::size_t len = std::min(segment, n - off);
      const W* out = nullptr;
      if constexpr (comm::kConverts<T, W>) {
        comm::encode(data + off, scratch, len);
        out = scratch;
      } else {
        out = data + off;
      }
      MPI_CHECK(MPI_Send(out, static_cast<int>(len), mpi_type<W>(), 0, kServerTag, comm));
      sent += len * sizeof(W);
    }
  }
  // The sum back to everyone.
  broadcast_sum(data, n, rank, comm, segment, scratch);
  return sent;
}

template std::uint64_t parameter_server_allreduce_sum<float, float>(float*, std::size_t, MPI_Comm, std::size_t, float*);
template std::uint64_t parameter_server_allreduce_sum<double, double>(double*, std::size_t, MPI_Comm, std::size_t, double*);
template std::uint64_t parameter_server_allreduce_sum<float, std::uint16_t>(float*, std::size_t, MPI_Comm, std::size_t,
                                                                            std::uint16_t*);

}  // namespace tessera
