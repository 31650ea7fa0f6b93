#include "comm/ring_allreduce.hpp"

#include <array>
#include <climits>

#include "comm/mpi_check.hpp"
#include "comm/mpi_type.hpp"
#include "comm/wire.hpp"

namespace tessera {

namespace {

constexpr int kRingTag = 0x7e55;  // "tess": keeps ring messages apart from other point-to-point

std::size_t segments(std::size_t len, std::size_t segment) { return (len + segment - 1) / segment; }

/// Segments in flight each way in one ring step (receive slots of scratch). Measured on 2 ranks
/// at 16 MB (docs/performance.md, "Transport"): 4 and 8 were no faster than 2, and calling into
/// MPI between blocks of the addition (to move the next segment meanwhile) was slower: with
/// mpi_yield_when_idle each call that finds nothing to do gives the core away.
constexpr std::size_t kRingDepth = 2;

std::size_t clamp_segment(std::size_t segment) {
  return std::clamp<std::size_t>(segment, 1, static_cast<std::size_t>(INT_MAX));
}

/// One ring step: send `send` (send_len elements) to `right` while receiving recv_len elements from
/// `left`, segment by segment, with up to kRingDepth segments in flight each way. Reduce: each
/// received segment lands in scratch (kRingDepth slots) and is added to `recv`; otherwise it lands
/// in `recv` directly (W = T) or in scratch and is decoded into `recv`. Where W differs from T each
/// segment is encoded into one of kRingDepth send slots of scratch first. Returns bytes sent.
template <class T, class W>
std::uint64_t ring_step(const T* send, std::size_t send_len, T* recv, std::size_t recv_len, bool reduce,
                        int left, int right, MPI_Comm comm, std::size_t segment, W* scratch) {
  constexpr bool converts = comm::kConverts<T, W>;
  constexpr std::size_t depth = kRingDepth;
  const MPI_Datatype type = mpi_type<W>();
  const std::size_t nseg = std::max(segments(send_len, segment), segments(recv_len, segment));
  std::array<MPI_Request, depth> recv_req, send_req;
  recv_req.fill(MPI_REQUEST_NULL);
  send_req.fill(MPI_REQUEST_NULL);
  auto seg_len = [segment](std::size_t len, std::size_t k) { return std::min(segment, len - k * segment); };
  auto landing = [&](std::size_t k) -> W* {
    if constexpr (!converts) {
      if (!reduce) return recv + k * segment;
    }
    return scratch + (k % depth) * segment;
  };
  auto post_recv = [&](std::size_t k) {
    if (k * segment < recv_len)
      MPI_CHECK(MPI_Irecv(landing(k), static_cast<int>(seg_len(recv_len, k)), type, left, kRingTag, comm,
                          &recv_req[k % depth]));
  };
  std::uint64_t sent = 0;
  for (std::size_t k = 0; k + 1 < depth; ++k) post_recv(k);
  for (std::size_t k = 0; k < nseg; ++k) {
    // Keep depth - 1 receives ahead, then send this segment once its slot's last send is done.
    post_recv(k + depth - 1);
    if (k * segment < send_len) {
      const std::size_t len = seg_len(send_len, k);
      MPI_CHECK(MPI_Wait(&send_req[k % depth], MPI_STATUS_IGNORE));
      const W* out = nullptr;
      if constexpr (converts) {
        W* staged = scratch + (depth + k % depth) * segment;
        comm::encode(send + k * segment, staged, len);
        out = staged;
      } else {
        out = send + k * segment;
      }
      MPI_CHECK(MPI_Isend(out, static_cast<int>(len), type, right, kRingTag, comm, &send_req[k % depth]));
      sent += len * sizeof(W);
    }
    // Wait for this segment and add (or decode) it.
    if (k * segment < recv_len) {
      MPI_CHECK(MPI_Wait(&recv_req[k % depth], MPI_STATUS_IGNORE));
      const std::size_t len = seg_len(recv_len, k);
      if (reduce) comm::add_decoded(landing(k), recv + k * segment, len);
      else if (converts) comm::decode(landing(k), recv + k * segment, len);
    }
  }
  MPI_CHECK(MPI_Waitall(static_cast<int>(depth), send_req.data(), MPI_STATUSES_IGNORE));
  return sent;
}

/// The ring of `comm` as seen from this rank.
struct Ring {
  int rank = 0, p = 1, left = 0, right = 0;
  explicit Ring(MPI_Comm comm) {
    MPI_CHECK(MPI_Comm_rank(comm, &rank));
    MPI_CHECK(MPI_Comm_size(comm, &p));
    right = (rank + 1) % p;
    left = (rank + p - 1) % p;
  }
  int mod(int i) const { return ((i % p) + p) % p; }
};

/// Segments longer than a chunk would only waste scratch.
std::size_t ring_segment(std::size_t n, int p, std::size_t segment) {
  return std::min(clamp_segment(segment), std::max<std::size_t>(1, RingChunks{n, p}.length(0)));
}

}  // namespace

std::size_t ring_allreduce_scratch(std::size_t n, int ranks, std::size_t segment, bool converting) {
  if (ranks <= 1) return 0;
  return (converting ? 2 : 1) * kRingDepth * ring_segment(n, ranks, segment);
}

template <class T, class W>
std::uint64_t ring_reduce_scatter(T* data, std::size_t n, MPI_Comm comm, std::size_t segment, W* scratch) {
  const Ring ring(comm);
  if (ring.p == 1 || n == 0) return 0;
  const RingChunks c{n, ring.p};
  segment = ring_segment(n, ring.p, segment);
  // At step s send chunk r-s, receive and add chunk r-s-1. After p-1 steps this rank holds the
  // full sum of chunk r+1.
  std::uint64_t sent = 0;
  for (int s = 0; s < ring.p - 1; ++s) {
    const int out = ring.mod(ring.rank - s), in = ring.mod(ring.rank - s - 1);
    sent += ring_step(data + c.offset(out), c.length(out), data + c.offset(in), c.length(in), true, ring.left,
                      ring.right, comm, segment, scratch);
  }
  return sent;
}

template <class T, class W>
std::uint64_t ring_allgather(T* data, std::size_t n, MPI_Comm comm, std::size_t segment, W* scratch) {
  const Ring ring(comm);
  if (ring.p == 1 || n == 0) return 0;
  const RingChunks c{n, ring.p};
  segment = ring_segment(n, ring.p, segment);
  // The owner's copy must equal what the others receive.
  const int mine = ring_owned_chunk(ring.rank, ring.p);
  comm::round_to_wire<T, W>(data + c.offset(mine), c.length(mine));
  // At step s pass on chunk r+1-s, receive the finished chunk r-s.
  std::uint64_t sent = 0;
  for (int s = 0; s < ring.p - 1; ++s) {
    const int out = ring.mod(ring.rank + 1 - s), in = ring.mod(ring.rank - s);
    sent += ring_step(data + c.offset(out), c.length(out), data + c.offset(in), c.length(in), false, ring.left,
                      ring.right, comm, segment, scratch);
  }
  return sent;
}

template <class T, class W>
std::uint64_t ring_allreduce_sum(T* data, std::size_t n, MPI_Comm comm, std::size_t segment, W* scratch) {
  const std::uint64_t sent = ring_reduce_scatter(data, n, comm, segment, scratch);
  return sent + ring_allgather(data, n, comm, segment, scratch);
}

#define TESSERA_RING_DEFINE(T, W)                                                              \
  template std::uint64_t ring_allreduce_sum<T, W>(T*, std::size_t, MPI_Comm, std::size_t, W*); \
  template std::uint64_t ring_reduce_scatter<T, W>(T*, std::size_t, MPI_Comm, std::size_t, W*); \
  template std::uint64_t ring_allgather<T, W>(T*, std::size_t, MPI_Comm, std::size_t, W*);
TESSERA_RING_DEFINE(float, float)
TESSERA_RING_DEFINE(double, double)
TESSERA_RING_DEFINE(float, std::uint16_t)
#undef TESSERA_RING_DEFINE

}  // namespace tessera
