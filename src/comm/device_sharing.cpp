#include "comm/device_sharing.hpp"

#include <algorithm>
#include <array>
#include <cstring>
#include <string>
#include <vector>

#include "comm/device_memory.hpp"
#include "comm/mpi_check.hpp"

namespace tessera::comm {

DeviceSharing detect_device_sharing(MPI_Comm world) {
  using Id = std::array<char, 64>;  // a PCI bus id is 13 characters; zero-padded
  Id mine{};
  const std::string id = device::current_device_id();
  std::memcpy(mine.data(), id.data(), std::min(id.size(), mine.size() - 1));

  MPI_Comm node = MPI_COMM_NULL;
  MPI_CHECK(MPI_Comm_split_type(world, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node));
  int node_size = 1;
  MPI_CHECK(MPI_Comm_size(node, &node_size));
  std::vector<Id> ids(static_cast<std::size_t>(node_size));
  MPI_CHECK(MPI_Allgather(mine.data(), int(mine.size()), MPI_CHAR, ids.data(), int(mine.size()), MPI_CHAR, node));
  MPI_CHECK(MPI_Comm_free(&node));

  // Ranks of this node on this rank's device; the maximum over all ranks is the answer.
  int same = 1;
  if (mine[0] != '\0') same = int(std::count(ids.begin(), ids.end(), mine));
  MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &same, 1, MPI_INT, MPI_MAX, world));
  DeviceSharing sharing;
  sharing.ranks_per_device = same;
  return sharing;
}

}  // namespace tessera::comm
