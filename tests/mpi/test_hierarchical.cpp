// comm.allreduce = "hierarchical" and Communicator::node_split on 1, 2 and 4 ranks, with the
// ranks split into fake nodes by the test hook TESSERA_TEST_NODE_OF_RANK=K (world rank r on node
// r / K): even nodes (K = 1, 2), uneven ones (K = 3 on 4 ranks: 3 + 1, the leader scheme), one
// node (K = 4, and the real shared-memory split). The sum against a reference, bitwise the same
// on every rank, fp32 and bf16; the split's node indices and communicators; the bytes that cross
// nodes fall against a flat ring; and a malformed hook is refused.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "comm/bf16.hpp"
#include "comm/communicator.hpp"
#include "mpi_test_util.hpp"

namespace tessera {
namespace {

using tessera::test::expect_input_error;
using tessera::test::world_rank;
using tessera::test::world_size;

/// TESSERA_TEST_NODE_OF_RANK set while it lives (read when a Communicator is built).
class FakeNodes {
 public:
  explicit FakeNodes(const std::string& k) { setenv("TESSERA_TEST_NODE_OF_RANK", k.c_str(), 1); }
  ~FakeNodes() { unsetenv("TESSERA_TEST_NODE_OF_RANK"); }
  FakeNodes(const FakeNodes&) = delete;
  FakeNodes& operator=(const FakeNodes&) = delete;
};

float value(int rank, std::size_t i) {
  std::uint64_t z = 0x2545f4914f6cdd1dull * (static_cast<std::uint64_t>(rank) * 104729 + i + 1);
  z = (z ^ (z >> 29)) * 0xbf58476d1ce4e5b9ull;
  z ^= z >> 32;
  return static_cast<float>(static_cast<double>(z >> 11) * 0x1.0p-52 - 1.0);
}

/// Hierarchical sums of several lengths and segments against the reference; every rank alike.
void check_hierarchical(Communicator& c, ReduceDtype wire) {
  const int p = c.size(Group::world), me = c.rank(Group::world);
  c.set_allreduce(AllreduceAlgorithm::hierarchical, 1 << 20);
  for (const std::size_t segment : {std::size_t{1} << 20, std::size_t{8}})
    for (const std::size_t n : {std::size_t{1}, std::size_t{5}, std::size_t{1003}, std::size_t{40000}}) {
      if (segment < 1024 && n > 2000) continue;
      SCOPED_TRACE(testing::Message() << "n = " << n << ", segment " << segment << ", wire "
                                      << (wire == ReduceDtype::bf16 ? "bf16" : "fp32"));
      c.set_allreduce(AllreduceAlgorithm::hierarchical, segment);
      std::vector<float> v(n);
      for (std::size_t i = 0; i < n; ++i) v[i] = value(me, i);
      c.allreduce_sum(v.data(), n, Group::world, wire);
      const double unit = wire == ReduceDtype::bf16 ? 0x1p-8 : std::numeric_limits<float>::epsilon();
      std::size_t bad = 0;
      for (std::size_t i = 0; i < n && p > 1; ++i) {
        double ref = 0, mag = 0;
        for (int r = 0; r < p; ++r) {
          const float x = wire == ReduceDtype::bf16 ? comm::from_bf16(comm::to_bf16(value(r, i))) : value(r, i);
          ref += x;
          mag += std::abs(x);
        }
        if (!(std::abs(v[i] - ref) <= (p + 1) * unit * mag) && bad++ < 5)
          ADD_FAILURE() << "element " << i << ": " << v[i] << ", the sum is " << ref;
      }
      EXPECT_EQ(bad, 0u);
      std::vector<float> root = v;
      MPI_Bcast(root.data(), static_cast<int>(n), MPI_FLOAT, 0, MPI_COMM_WORLD);
      EXPECT_EQ(std::memcmp(root.data(), v.data(), n * sizeof(float)), 0) << "ranks hold different sums";
    }
}

TEST(Hierarchical, SumsOnEvenUnevenAndSingleNodes) {
  for (const char* k : {"1", "2", "3", "4", ""}) {
    SCOPED_TRACE(testing::Message() << "TESSERA_TEST_NODE_OF_RANK=" << k);
    const FakeNodes fake(k);
    Communicator c(MPI_COMM_WORLD, world_size(), 1, 1);
    check_hierarchical(c, ReduceDtype::fp32);
    check_hierarchical(c, ReduceDtype::bf16);
  }
}

TEST(Hierarchical, NodeSplitOfTheWorldAndOfSmallerGroups) {
  const int p = world_size(), me = world_rank();
  for (const int k : {1, 2, 3}) {
    SCOPED_TRACE(testing::Message() << "TESSERA_TEST_NODE_OF_RANK=" << k);
    const FakeNodes fake(std::to_string(k));
    Communicator c(MPI_COMM_WORLD, p, 1, 1);
    const comm::NodeSplit& s = c.node_split(Group::world);
    EXPECT_EQ(&s, &c.node_split(Group::world)) << "built once, then cached";
    const int nodes = (p + k - 1) / k;
    EXPECT_EQ(s.nodes, nodes);
    EXPECT_EQ(s.node_index, me / k);
    EXPECT_EQ(s.local_rank, me % k);
    EXPECT_EQ(s.local_size, std::min(k, p - me / k * k));
    EXPECT_EQ(s.even, p % k == 0 || nodes == 1);
    ASSERT_EQ(s.node_of.size(), static_cast<std::size_t>(p));
    for (int r = 0; r < p; ++r) EXPECT_EQ(s.node_of[static_cast<std::size_t>(r)], r / k);
    int node_size = 0, cross_size = 0, cross_rank = 0;
    MPI_Comm_size(s.node_comm, &node_size);
    MPI_Comm_size(s.cross_comm, &cross_size);
    MPI_Comm_rank(s.cross_comm, &cross_rank);
    EXPECT_EQ(node_size, s.local_size);
    EXPECT_EQ(cross_rank, s.node_index) << "cross_comm ranks follow the node order";
    int same_index = 0;
    for (int r = 0; r < p; ++r) same_index += r % k == me % k;
    EXPECT_EQ(cross_size, same_index);
  }
  // A group of every other rank (tp = 2) on nodes of 2: each data group has one rank per node.
  if (p == 4) {
    const FakeNodes fake("2");
    Communicator c(MPI_COMM_WORLD, 2, 2, 1);
    const comm::NodeSplit& s = c.node_split(Group::data);
    EXPECT_EQ(s.nodes, 2);
    EXPECT_EQ(s.local_size, 1);
    EXPECT_EQ(s.node_index, c.rank(Group::data));
  }
}

TEST(Hierarchical, FewerBytesCrossNodesThanAFlatRing) {
  const int p = world_size();
  const FakeNodes fake("2");
  Communicator c(MPI_COMM_WORLD, p, 1, 1);
  const std::size_t n = 1 << 16;
  std::uint64_t across[2] = {0, 0}, sent[2] = {0, 0};
  for (const AllreduceAlgorithm a : {AllreduceAlgorithm::ring, AllreduceAlgorithm::hierarchical}) {
    c.set_allreduce(a, 1 << 20);
    std::vector<float> v(n, 1.0f);
    c.reset_counters();
    c.allreduce_sum(v.data(), n, Group::world);
    const CommBytes b = c.counters()[Group::world];
    const int i = a == AllreduceAlgorithm::hierarchical;
    across[i] = b.to_other_nodes;
    sent[i] = b.total();
    MPI_Allreduce(MPI_IN_PLACE, &across[i], 1, MPI_UINT64_T, MPI_SUM, MPI_COMM_WORLD);
    MPI_Allreduce(MPI_IN_PLACE, &sent[i], 1, MPI_UINT64_T, MPI_SUM, MPI_COMM_WORLD);
    for (const float x : v) ASSERT_EQ(x, static_cast<float>(p));
  }
  const std::uint64_t bytes = n * sizeof(float);
  if (p == 1) {
    EXPECT_EQ(sent[0] + sent[1], 0u);
  } else if (p == 2) {  // one node: nothing crosses
    EXPECT_EQ(across[0] + across[1], 0u);
    EXPECT_EQ(sent[1], sent[0]);
  } else {  // 2 nodes x 2: the ring crosses twice with 2 x 3/4 of the buffer, hierarchical 4 x 1/2 x 1/2
    EXPECT_EQ(across[0], 3 * bytes);
    EXPECT_EQ(across[1], 2 * bytes);
    EXPECT_EQ(sent[0], sent[1]) << "the same bytes in all, fewer of them across";
  }
}

TEST(Hierarchical, MalformedHookIsRefused) {
  for (const char* bad : {"0", "x", "-2", "2x"}) {
    const FakeNodes fake(bad);
    expect_input_error([] { Communicator c(MPI_COMM_WORLD, world_size(), 1, 1); },
                       {"TESSERA_TEST_NODE_OF_RANK", bad, "positive integer"});
  }
}

}  // namespace
}  // namespace tessera
