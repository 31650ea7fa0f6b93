#pragma once
// Hierarchical allreduce (comm.allreduce = "hierarchical") over a group seen as nodes
// (comm/node_split.hpp), built from the ring's two halves (comm/ring_allreduce.hpp):
//
//   even nodes (every node holds L ranks of the group):
//     1. ring reduce-scatter inside the node: local rank j holds the node's sum of chunk
//        ring_owned_chunk(j, L) of L;
//     2. ring allreduce of that chunk across nodes, with the ranks of local rank j on the other
//        nodes (cross_comm): every node's rank j holds the group's sum of chunk j;
//     3. ring allgather inside the node.
//     Each rank sends 2(L-1)/L of the buffer inside its node and 2(N-1)/(N L) of it across
//     nodes: 2(N-1)/N of the buffer leaves a node, over L ranks and in 2(N-1) steps, where a
//     flat ring over the N x L ranks sends 2(NL-1)/(NL) of it out of each node from one rank in
//     2(NL-1) steps.
//   uneven nodes (a leader scheme): ring allreduce inside the node, ring allreduce of the whole
//     buffer among the nodes' local rank 0, MPI_Bcast from it inside the node.
//
// Each chunk is reduced along one fixed path and copied, so every rank of the group ends with
// bitwise the same values. Wire type W as in the ring (bf16 partial sums, fp32 additions).
#include <cstddef>
#include <cstdint>

#include "comm/node_split.hpp"

namespace tessera {

/// Bytes one call sent from this rank: to ranks of its own node and of other nodes (its own
/// messages), and the payload it handed to MPI_Bcast (leader scheme, inside the node).
struct HierarchicalSent {
  std::uint64_t within = 0, across = 0, broadcast = 0;
};

/// \brief Elements of W scratch hierarchical_allreduce_sum needs.
std::size_t hierarchical_scratch(std::size_t n, const comm::NodeSplit& split, std::size_t segment, bool converting);

/// \brief Sums `n` values of `data` in place over the group `split` was made of. Collective over
/// the group, with the same n and segment on every rank.
/// \param segment  elements per pipelined message; \param scratch  hierarchical_scratch elements
template <class T, class W = T>
HierarchicalSent hierarchical_allreduce_sum(T* data, std::size_t n, const comm::NodeSplit& split, std::size_t segment,
                                            W* scratch);

extern template HierarchicalSent hierarchical_allreduce_sum<float, float>(float*, std::size_t, const comm::NodeSplit&,
                                                                          std::size_t, float*);
extern template HierarchicalSent hierarchical_allreduce_sum<double, double>(double*, std::size_t,
                                                                            const comm::NodeSplit&, std::size_t, double*);
extern template HierarchicalSent hierarchical_allreduce_sum<float, std::uint16_t>(float*, std::size_t,
                                                                                  const comm::NodeSplit&, std::size_t,
                                                                                  std::uint16_t*);

}  // namespace tessera
