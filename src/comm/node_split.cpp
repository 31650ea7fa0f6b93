#include "comm/node_split.hpp"

#include <algorithm>
#include <utility>

#include "comm/mpi_check.hpp"
#include "core/test_hooks.hpp"

namespace tessera::comm {

NodeSplit::NodeSplit(NodeSplit&& o) noexcept
    : node_comm(std::exchange(o.node_comm, MPI_COMM_NULL)),
      cross_comm(std::exchange(o.cross_comm, MPI_COMM_NULL)),
      nodes(o.nodes), node_index(o.node_index), local_rank(o.local_rank), local_size(o.local_size), even(o.even),
      node_of(std::move(o.node_of)), ranks_per_node(std::move(o.ranks_per_node)) {}

NodeSplit& NodeSplit::operator=(NodeSplit&& o) noexcept {
  if (this != &o) {
    NodeSplit old(std::move(*this));
    node_comm = std::exchange(o.node_comm, MPI_COMM_NULL);
    cross_comm = std::exchange(o.cross_comm, MPI_COMM_NULL);
    nodes = o.nodes, node_index = o.node_index, local_rank = o.local_rank, local_size = o.local_size;
    even = o.even;
    node_of = std::move(o.node_of);
    ranks_per_node = std::move(o.ranks_per_node);
  }
  return *this;
}

NodeSplit::~NodeSplit() {
  if (node_comm != MPI_COMM_NULL) MPI_Comm_free(&node_comm);
  if (cross_comm != MPI_COMM_NULL) MPI_Comm_free(&cross_comm);
}

std::vector<int> world_node_ids(MPI_Comm world) {
  int rank = 0, size = 1;
  MPI_CHECK(MPI_Comm_rank(world, &rank));
  MPI_CHECK(MPI_Comm_size(world, &size));
  // Every rank reads the same environment, so a malformed hook fails on every rank alike.
  const int fake = test_hooks::node_of_rank();
  int id = fake > 0 ? rank / fake * fake : rank;
  if (fake == 0) {
    MPI_Comm node = MPI_COMM_NULL;
    MPI_CHECK(MPI_Comm_split_type(world, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node));
    MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &id, 1, MPI_INT, MPI_MIN, node));
    MPI_CHECK(MPI_Comm_free(&node));
  }
  std::vector<int> ids(static_cast<std::size_t>(size));
  MPI_CHECK(MPI_Allgather(&id, 1, MPI_INT, ids.data(), 1, MPI_INT, world));
  return ids;
}

NodeSplit split_by_node(MPI_Comm group, const std::vector<int>& node_id_of) {
  int rank = 0;
  MPI_CHECK(MPI_Comm_rank(group, &rank));
  NodeSplit s;
  // Node indices in order of each node's first rank in the group.
  std::vector<int> seen;
  for (const int id : node_id_of) {
    auto it = std::find(seen.begin(), seen.end(), id);
    if (it == seen.end()) {
      seen.push_back(id);
      s.ranks_per_node.push_back(0);
      it = seen.end() - 1;
    }
    const auto index = static_cast<int>(it - seen.begin());
    s.node_of.push_back(index);
    ++s.ranks_per_node[static_cast<std::size_t>(index)];
  }
  s.nodes = static_cast<int>(seen.size());
  s.node_index = s.node_of[static_cast<std::size_t>(rank)];
  s.even = std::all_of(s.ranks_per_node.begin(), s.ranks_per_node.end(),
                       [&](int k) { return k == s.ranks_per_node.front(); });
  MPI_CHECK(MPI_Comm_split(group, s.node_index, rank, &s.node_comm));
  MPI_CHECK(MPI_Comm_rank(s.node_comm, &s.local_rank));
  MPI_CHECK(MPI_Comm_size(s.node_comm, &s.local_size));
  MPI_CHECK(MPI_Comm_split(group, s.local_rank, s.node_index, &s.cross_comm));
  return s;
}

}  // namespace tessera::comm
