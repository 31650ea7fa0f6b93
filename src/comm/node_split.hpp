#pragma once
// Which ranks share a node, for the hierarchical allreduce and for hybrid sharding (shard within
// a node, replicate across nodes). A node is a shared-memory domain (MPI_Comm_split_type with
// MPI_COMM_TYPE_SHARED), found once for the world when the Communicator is built; a group's split
// follows from its members' nodes (Communicator::node_split, built on first use and cached).
//
// Test hook: TESSERA_TEST_NODE_OF_RANK=K makes world rank r's node r / K (K ranks per fake node)
// instead of the real shared-memory domains, so that one machine can test several "nodes". Only
// tests set it; a value that is not a positive integer is an InputError on every rank.
#include <mpi.h>

#include <vector>

namespace tessera::comm {

/// \brief One group seen as nodes. Nodes are numbered 0, 1, ... in the order of their lowest rank
/// in the group. Owns its two communicators (move-only).
struct NodeSplit {
  /// This rank's node's part of the group, ranks in group-rank order (local_rank, local_size).
  MPI_Comm node_comm = MPI_COMM_NULL;
  /// The group's ranks whose local rank equals this rank's, one per node (fewer where nodes are
  /// uneven), in node order: rank i of it is on node i where the nodes are even.
  MPI_Comm cross_comm = MPI_COMM_NULL;
  int nodes = 1;       ///< nodes the group spans
  int node_index = 0;  ///< this rank's node
  int local_rank = 0;  ///< this rank's rank in node_comm
  int local_size = 1;  ///< the group's ranks on this rank's node
  bool even = true;    ///< every node holds the same number of the group's ranks
  std::vector<int> node_of;         ///< node index of each rank of the group, in group-rank order
  std::vector<int> ranks_per_node;  ///< the group's ranks on each node, by node index

  NodeSplit() = default;
  NodeSplit(NodeSplit&& o) noexcept;
  NodeSplit& operator=(NodeSplit&& o) noexcept;
  NodeSplit(const NodeSplit&) = delete;
  NodeSplit& operator=(const NodeSplit&) = delete;
  ~NodeSplit();
};

/// \brief A node id of every world rank (the lowest world rank on its node), in world-rank order.
/// Collective over `world`; honours TESSERA_TEST_NODE_OF_RANK.
std::vector<int> world_node_ids(MPI_Comm world);

/// \brief The split of group `group` whose rank r is on the node with id `node_id_of[r]`.
/// Collective over `group`.
NodeSplit split_by_node(MPI_Comm group, const std::vector<int>& node_id_of);

}  // namespace tessera::comm
