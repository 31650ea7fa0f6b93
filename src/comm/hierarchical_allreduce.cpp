#include "comm/hierarchical_allreduce.hpp"

#include <algorithm>
#include <climits>

#include "comm/mpi_check.hpp"
#include "comm/mpi_type.hpp"
#include "comm/ring_allreduce.hpp"

namespace tessera {

namespace {

/// The leader scheme of uneven nodes.
template <class T, class W>
HierarchicalSent leader_allreduce(T* data, std::size_t n, const comm::NodeSplit& s, std::size_t segment, W* scratch) {
  HierarchicalSent sent;
  sent.within = ring_allreduce_sum(data, n, s.node_comm, segment, scratch);
  if (s.local_rank == 0) sent.across = ring_allreduce_sum(data, n, s.cross_comm, segment, scratch);
  // The leaders' values (bf16 values already, with a bf16 wire) to the rest of the node.
  if (s.local_size > 1) {
    constexpr auto kMax = static_cast<std::size_t>(INT_MAX);
    for (std::size_t off = 0; off < n; off += kMax)
      MPI_CHECK(MPI_Bcast(data + off, static_cast<int>(std::min(kMax, n - off)), mpi_type<T>(), 0, s.node_comm));
    if (s.local_rank == 0) sent.broadcast = n * sizeof(T);
  }
  return sent;
}

}  // namespace

std::size_t hierarchical_scratch(std::size_t n, const comm::NodeSplit& split, std::size_t segment, bool converting) {
  return std::max(ring_allreduce_scratch(n, split.local_size, segment, converting),
                  ring_allreduce_scratch(n, split.nodes, segment, converting));
}

template <class T, class W>
HierarchicalSent hierarchical_allreduce_sum(T* data, std::size_t n, const comm::NodeSplit& s, std::size_t segment,
                                            W* scratch) {
  if (n == 0 || (s.nodes == 1 && s.local_size == 1)) return {};
  if (!s.even) return leader_allreduce(data, n, s, segment, scratch);
  HierarchicalSent sent;
  sent.within = ring_reduce_scatter(data, n, s.node_comm, segment, scratch);
  const RingChunks chunks{n, s.local_size};
  const int mine = ring_owned_chunk(s.local_rank, s.local_size);
  sent.across = ring_allreduce_sum(data + chunks.offset(mine), chunks.length(mine), s.cross_comm, segment, scratch);
  sent.within += ring_allgather(data, n, s.node_comm, segment, scratch);
  return sent;
}

template HierarchicalSent hierarchical_allreduce_sum<float, float>(float*, std::size_t, const comm::NodeSplit&,
                                                                   std::size_t, float*);
template HierarchicalSent hierarchical_allreduce_sum<double, double>(double*, std::size_t, const comm::NodeSplit&,
                                                                     std::size_t, double*);
template HierarchicalSent hierarchical_allreduce_sum<float, std::uint16_t>(float*, std::size_t, const comm::NodeSplit&,
                                                                           std::size_t, std::uint16_t*);

}  // namespace tessera
