#include "comm/ring_allreduce.hpp"

#include <algorithm>
#include <climits>

#include "comm/mpi_check.hpp"
#include "comm/mpi_type.hpp"

namespace tessera {

namespace {

constexpr int kRingTag = 0x7e55;  // "tess": keeps ring messages apart from other point-to-point

/// Chunk i of n elements over p ranks: the first n % p chunks hold one element more.
struct Chunks {
  std::size_t n;
  int p;
  std::size_t offset(int i) const {
    const std::size_t base = n / p, extra = n % p, ui = static_cast<std::size_t>(i);
    return ui * base + std::min(ui, extra);
  }
  std::size_t length(int i) const {
    return n / p + (static_cast<std::size_t>(i) < n % p ? 1 : 0);
  }
};

std::size_t segments(std::size_t len, std::size_t segment) { return (len + segment - 1) / segment; }

/// One ring step: send `send` (len elements) to `right` while receiving `recv_len` elements from
/// `left`, segment by segment with the next receive posted ahead. Reduce: each received segment
/// lands in scratch (two alternating segments) and is added to `recv`; otherwise it lands in
/// `recv` directly.
template <class T>
void ring_step(const T* send, std::size_t send_len, T* recv, std::size_t recv_len, bool reduce,
               int left, int right, MPI_Comm comm, std::size_t segment, T* scratch) {
  const MPI_Datatype type = mpi_type<T>();
  const std::size_t nseg = std::max(segments(send_len, segment), segments(recv_len, segment));
  MPI_Request recv_req[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
  MPI_Request send_req[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
  auto seg_len = [segment](std::size_t len, std::size_t k) {
    return static_cast<int>(std::min(segment, len - k * segment));
  };
  auto landing = [&](std::size_t k) { return reduce ? scratch + (k % 2) * segment : recv + k * segment; };
  auto post_recv = [&](std::size_t k) {
    if (k * segment < recv_len)
      MPI_CHECK(MPI_Irecv(landing(k), seg_len(recv_len, k), type, left, kRingTag, comm, &recv_req[k % 2]));
  };
  // Post the first receive.
  post_recv(0);
  for (std::size_t k = 0; k < nseg; ++k) {
    // Post the next receive into the other half of scratch, then send this segment.
    post_recv(k + 1);
    if (k * segment < send_len) {
      MPI_CHECK(MPI_Wait(&send_req[k % 2], MPI_STATUS_IGNORE));
      MPI_CHECK(MPI_Isend(send + k * segment, seg_len(send_len, k), type, right, kRingTag, comm,
                          &send_req[k % 2]));
    }
    // Wait for this segment and add it.
    if (k * segment < recv_len) {
      MPI_CHECK(MPI_Wait(&recv_req[k % 2], MPI_STATUS_IGNORE));
      if (reduce) {
        const T* in = scratch + (k % 2) * segment;
        T* out = recv + k * segment;
        const int len = seg_len(recv_len, k);
        for (int i = 0; i < len; ++i) out[i] += in[i];
      }
    }
  }
  MPI_CHECK(MPI_Waitall(2, send_req, MPI_STATUSES_IGNORE));
}

std::size_t clamp_segment(std::size_t segment) {
  return std::clamp<std::size_t>(segment, 1, static_cast<std::size_t>(INT_MAX));
}

}  // namespace

std::size_t ring_allreduce_scratch(std::size_t n, int ranks, std::size_t segment) {
  if (ranks <= 1) return 0;
  const std::size_t chunk = Chunks{n, ranks}.length(0);
  return 2 * std::min(clamp_segment(segment), chunk);
}

template <class T>
void ring_allreduce_sum(T* data, std::size_t n, MPI_Comm comm, std::size_t segment, T* scratch) {
  int rank = 0, p = 1;
  MPI_CHECK(MPI_Comm_rank(comm, &rank));
  MPI_CHECK(MPI_Comm_size(comm, &p));
  if (p == 1 || n == 0) return;
  // Segments longer than a chunk would only waste scratch.
  const Chunks c{n, p};
  segment = std::min(clamp_segment(segment), std::max<std::size_t>(1, c.length(0)));
  const int right = (rank + 1) % p, left = (rank + p - 1) % p;
  auto mod = [p](int i) { return ((i % p) + p) % p; };
  // Reduce-scatter: at step s send chunk r-s, receive and add chunk r-s-1. After p-1 steps
  // this rank holds the full sum of chunk r+1.
  for (int s = 0; s < p - 1; ++s) {
    const int out = mod(rank - s), in = mod(rank - s - 1);
    ring_step(data + c.offset(out), c.length(out), data + c.offset(in), c.length(in), true, left,
              right, comm, segment, scratch);
  }
  // Allgather: at step s pass on chunk r+1-s, receive the finished chunk r-s.
  for (int s = 0; s < p - 1; ++s) {
    const int out = mod(rank + 1 - s), in = mod(rank - s);
    ring_step(data + c.offset(out), c.length(out), data + c.offset(in), c.length(in), false, left,
              right, comm, segment, scratch);
  }
}

template void ring_allreduce_sum<float>(float*, std::size_t, MPI_Comm, std::size_t, float*);
template void ring_allreduce_sum<double>(double*, std::size_t, MPI_Comm, std::size_t, double*);

}  // namespace tessera
