// Every allreduce algorithm (mpi, ring, parameter-server, hierarchical) on 1, 2 and 4 ranks against a reference
// sum in double of data that is a pure function of (seed, rank, index), for lengths that do not
// divide by the rank count, float and double, large and tiny ring segments; and every rank of a
// group must end with bitwise the same result.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "comm/communicator.hpp"
#include "mpi_test_util.hpp"

namespace tessera {
namespace {

using tessera::test::world_size;

constexpr std::uint64_t kSeed = 0x5eed;

/// A value in [-1, 1) from (rank, index), splitmix64.
double value(int rank, std::size_t i) {
  std::uint64_t z = kSeed + 0x9e3779b97f4a7c15ull * (static_cast<std::uint64_t>(rank) * 0x100000001b3ull + i + 1);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return static_cast<double>(z >> 11) * 0x1.0p-52 - 1.0;
}

/// FNV-1a over the bytes of v.
template <class T>
std::uint64_t hash_bytes(const std::vector<T>& v) {
  std::uint64_t h = 1469598103934665603ull;
  const auto* b = reinterpret_cast<const unsigned char*>(v.data());
  for (std::size_t i = 0; i < v.size() * sizeof(T); ++i) h = (h ^ b[i]) * 1099511628211ull;
  return h;
}

const char* name(AllreduceAlgorithm a) {
  switch (a) {
    case AllreduceAlgorithm::mpi: return "mpi";
    case AllreduceAlgorithm::ring: return "ring";
    case AllreduceAlgorithm::parameter_server: return "parameter-server";
    case AllreduceAlgorithm::hierarchical: return "hierarchical";
  }
  return "?";
}

/// Sums data of length n over the data group of c with algorithm a and checks the result.
template <class T>
void check_sum(Communicator& c, AllreduceAlgorithm a, std::size_t segment_bytes, std::size_t n) {
  SCOPED_TRACE(testing::Message() << name(a) << " segment " << segment_bytes << " B, n = " << n
                                  << ", " << sizeof(T) << "-byte elements, dp = " << c.dp());
  const int p = c.size(Group::data), me = c.rank(Group::data);
  std::vector<T> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<T>(value(me, i));
  c.set_allreduce(a, segment_bytes);
  c.allreduce_sum(v.data(), n, Group::data);

  // Against the reference sum in double of the same T-rounded inputs.
  std::size_t bad = 0;
  for (std::size_t i = 0; i < n; ++i) {
    double ref = 0, mag = 0;
    for (int r = 0; r < p; ++r) {
      const double x = static_cast<T>(value(r, i));
      ref += x;
      mag += std::abs(x);
    }
    const double tol = 2.0 * p * std::numeric_limits<T>::epsilon() * mag;
    if (!(std::abs(static_cast<double>(v[i]) - ref) <= tol) && bad++ < 5)
      ADD_FAILURE() << "element " << i << ": " << v[i] << " but the sum is " << ref;
  }
  EXPECT_EQ(bad, 0u);

  // Bitwise the same on every rank of the group: min and max of the hash agree.
  std::uint64_t h[2] = {hash_bytes(v), ~hash_bytes(v)};
  MPI_Allreduce(MPI_IN_PLACE, h, 2, MPI_UINT64_T, MPI_MAX, c.handle(Group::data));
  EXPECT_EQ(h[0], ~h[1]) << "ranks of the data group hold different results";
}

const std::vector<std::size_t> kLengths = {0, 1, 3, 7, 1000, 4099, std::size_t{1} << 20};
// hierarchical on one machine is one node: a ring inside it (tests/mpi/test_hierarchical.cpp
// splits the ranks into fake nodes).
const AllreduceAlgorithm kAlgorithms[] = {AllreduceAlgorithm::mpi, AllreduceAlgorithm::ring,
                                          AllreduceAlgorithm::parameter_server, AllreduceAlgorithm::hierarchical};

template <class T>
void check_all(Communicator& c, std::size_t max_small) {
  for (AllreduceAlgorithm a : kAlgorithms) {
    // The default segment (1 MiB): one segment per chunk below it, several for 1<<20 doubles.
    for (std::size_t n : kLengths) check_sum<T>(c, a, 1 << 20, n);
    // Small segments, so every chunk travels in many pipelined pieces, also a segment that
    // divides no chunk (12 bytes: 3 floats, 1 double).
    if (a == AllreduceAlgorithm::mpi) continue;
    for (std::size_t n : kLengths) check_sum<T>(c, a, 1024, n);
    for (std::size_t n : kLengths)
      if (n <= max_small) check_sum<T>(c, a, 12, n);
  }
}

TEST(Allreduce, EveryAlgorithmSumsFloats) {
  Communicator c(MPI_COMM_WORLD, world_size(), 1, 1);
  check_all<float>(c, 4099);
}

TEST(Allreduce, EveryAlgorithmSumsDoubles) {
  Communicator c(MPI_COMM_WORLD, world_size(), 1, 1);
  check_all<double>(c, 4099);
}

TEST(Allreduce, DataGroupsSmallerThanTheWorld) {
  // tp = 2 where the rank count is even: two data groups of world / 2 reduce side by side
  // without mixing (at 2 ranks each group is one rank and the sum is the rank's own data).
  const int n = world_size(), tp = n % 2 == 0 ? 2 : 1;
  Communicator c(MPI_COMM_WORLD, n / tp, tp, 1);
  check_all<float>(c, 1000);
}

TEST(Allreduce, CommConfigPicksTheAlgorithm) {
  CommConfig cc;
  cc.allreduce = AllreduceAlgorithm::ring;
  cc.ring_segment_kb = 1;
  Communicator c(MPI_COMM_WORLD, world_size(), 1, 1, cc);
  EXPECT_EQ(c.allreduce_algorithm(), AllreduceAlgorithm::ring);
  std::vector<double> v(5000, 1.0);
  c.allreduce_sum(v.data(), v.size(), Group::data);
  for (double x : v) ASSERT_EQ(x, world_size());
}

}  // namespace
}  // namespace tessera
