// comm.reduce_dtype = "bf16" on 1, 2 and 4 ranks: every algorithm (mpi, ring, parameter-server,
// hierarchical), the blocking and nonblocking allreduce and reduce-scatter, against a naive
// reference (the fp32 sum of the bf16-rounded inputs, within the bound of a bf16 rounding per
// addition), exactly for values whose bf16 rounding is known (ties to even), bitwise the same on
// every rank, bf16 values in the fp32 result, and half the bytes in the counters.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

#include "comm/bf16.hpp"
#include "comm/communicator.hpp"
#include "mpi_test_util.hpp"

namespace tessera {
namespace {

using tessera::test::world_size;

const AllreduceAlgorithm kAlgorithms[] = {AllreduceAlgorithm::mpi, AllreduceAlgorithm::ring,
                                          AllreduceAlgorithm::parameter_server, AllreduceAlgorithm::hierarchical};

/// A value in [-1, 1) from (rank, index).
float value(int rank, std::size_t i) {
  std::uint64_t z = 0x9e3779b97f4a7c15ull * (static_cast<std::uint64_t>(rank) * 7919 + i + 1);
  z = (z ^ (z >> 31)) * 0xbf58476d1ce4e5b9ull;
  z ^= z >> 29;
  return static_cast<float>(static_cast<double>(z >> 11) * 0x1.0p-52 - 1.0);
}

std::vector<float> inputs(int rank, std::size_t n) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = value(rank, i);
  return v;
}

/// Sums `got` was checked against: element i of the sum over p ranks of bf16(value(r, i)), and
/// the bound: a bf16 rounding (2^-8 relative) per addition and one at the end, of at most the
/// sum of the magnitudes.
void expect_bf16_sum(const std::vector<float>& got, std::size_t first, int p, MPI_Comm group) {
  std::size_t bad = 0;
  for (std::size_t k = 0; k < got.size(); ++k) {
    double ref = 0, mag = 0;
    for (int r = 0; r < p; ++r) {
      const double x = comm::from_bf16(comm::to_bf16(value(r, first + k)));
      ref += x;
      mag += std::abs(x);
    }
    const double tol = (p + 1) * 0x1p-8 * mag;
    const bool is_bf16 = comm::from_bf16(comm::to_bf16(got[k])) == got[k];
    if ((!(std::abs(got[k] - ref) <= tol) || !is_bf16) && bad++ < 5)
      ADD_FAILURE() << "element " << first + k << ": " << got[k] << ", the sum is " << ref << " +- " << tol
                    << (is_bf16 ? "" : " (not a bf16 value)");
  }
  EXPECT_EQ(bad, 0u);
  // Bitwise the same on every rank of the group.
  std::vector<float> mine = got;
  MPI_Bcast(mine.data(), static_cast<int>(mine.size()), MPI_FLOAT, 0, group);
  EXPECT_EQ(std::memcmp(mine.data(), got.data(), got.size() * sizeof(float)), 0) << "ranks hold different sums";
}

TEST(Bf16Sum, EveryAlgorithmWithinTheBoundAndTheSameEverywhere) {
  Communicator c(MPI_COMM_WORLD, world_size(), 1, 1);
  const int p = c.size(Group::data), me = c.rank(Group::data);
  for (const AllreduceAlgorithm a : kAlgorithms)
    for (const std::size_t segment : {std::size_t{1} << 20, std::size_t{6}})
      for (const std::size_t n : {std::size_t{1}, std::size_t{3}, std::size_t{1001}, std::size_t{70000}}) {
        SCOPED_TRACE(testing::Message() << "algorithm " << static_cast<int>(a) << ", segment " << segment
                                        << " B, n = " << n);
        if (segment < 1024 && n > 2000) continue;
        c.set_allreduce(a, segment);
        std::vector<float> v = inputs(me, n);
        c.allreduce_sum(v.data(), n, Group::data, ReduceDtype::bf16);
        if (p == 1) {
          EXPECT_EQ(v, inputs(me, n)) << "one rank: nothing travels, nothing changes";
          continue;
        }
        expect_bf16_sum(v, 0, p, c.handle(Group::data));
      }
}

TEST(Bf16Sum, ChosenValuesRoundExactly) {
  // 1 + 2^-8 is a tie between 1 and 1 + 2^-7 (bf16's spacing at 1): even is 1, so every rank's
  // 1 + 2^-8 counts as 1 and the sum is exactly p; 1 + 3 * 2^-8 (rank 0 only) is a tie that
  // rounds up to 1 + 2^-6; 3 + 2^-20 rounds to 3. Small sums of these are exact in bf16.
  Communicator c(MPI_COMM_WORLD, world_size(), 1, 1);
  const int p = c.size(Group::data), me = c.rank(Group::data);
  for (const AllreduceAlgorithm a : kAlgorithms) {
    c.set_allreduce(a, 1 << 20);
    const std::vector<float> given = {1.0f + 0x1p-8f, me == 0 ? 1.0f + 3 * 0x1p-8f : 0.0f, 3.0f + 0x1p-20f};
    std::vector<float> v = given;
    c.allreduce_sum(v.data(), v.size(), Group::data, ReduceDtype::bf16);
    if (p == 1) {
      EXPECT_EQ(v, given) << "one rank: nothing travels, nothing is rounded; " << static_cast<int>(a);
      continue;
    }
    EXPECT_EQ(v[0], static_cast<float>(p)) << static_cast<int>(a);
    EXPECT_EQ(v[1], 1.0f + 0x1p-6f) << static_cast<int>(a);
    EXPECT_EQ(v[2], 3.0f * p) << static_cast<int>(a);
  }
}

TEST(Bf16Sum, CountersHalve) {
  Communicator c(MPI_COMM_WORLD, world_size(), 1, 1);
  const int p = c.size(Group::data), me = c.rank(Group::data);
  const std::size_t n = 4099;
  for (const AllreduceAlgorithm a : kAlgorithms) {
    c.set_allreduce(a, 1024);
    std::uint64_t bytes[2] = {0, 0};
    for (const ReduceDtype wire : {ReduceDtype::fp32, ReduceDtype::bf16}) {
      std::vector<float> v = inputs(me, n);
      c.reset_counters();
      c.allreduce_sum(v.data(), n, Group::data, wire);
      const CommBytes b = c.counters()[Group::data];
      EXPECT_EQ(b.calls, p > 1 ? 1u : 0u);
      EXPECT_EQ(b.point_to_point, 0u);
      bytes[wire == ReduceDtype::bf16] = b.total();
    }
    SCOPED_TRACE(testing::Message() << "algorithm " << static_cast<int>(a));
    if (p == 1) {
      EXPECT_EQ(bytes[0], 0u);
      continue;
    }
    EXPECT_GT(bytes[0], 0u);
    EXPECT_EQ(bytes[1] * 2, bytes[0]);
    if (a == AllreduceAlgorithm::mpi) {
      EXPECT_EQ(bytes[0], n * sizeof(float)) << "MPI's own: the call's payload";
    }
    if (a == AllreduceAlgorithm::ring) {  // what a ring sends: 2(p-1) chunks of about n / p
      EXPECT_NEAR(static_cast<double>(bytes[0]), 2.0 * (p - 1) * n * sizeof(float) / p, 2.0 * p * sizeof(float));
    }
  }
}

TEST(Bf16Sum, NonblockingAllreduceWritesOnCompletion) {
  Communicator c(MPI_COMM_WORLD, world_size(), 1, 1);
  const int p = c.size(Group::data), me = c.rank(Group::data);
  const std::size_t n = 5003;
  std::vector<float> a = inputs(me, n), b = inputs(me, n + 7);
  c.reset_counters();
  PendingOp first = c.iallreduce_sum(a.data(), n, Group::data, ReduceDtype::bf16);
  if (p > 1) {
    EXPECT_EQ(a, inputs(me, n)) << "written before completion";
  }
  // Moves keep the completion with the op (into a vector that grows).
  std::vector<PendingOp> ops;
  ops.push_back(std::move(first));
  ops.push_back(c.iallreduce_sum(b.data(), n + 7, Group::data, ReduceDtype::bf16));
  EXPECT_TRUE(first.done());
  while (!ops[1].test()) {
  }
  ops[0].wait();
  EXPECT_TRUE(ops[0].done() && ops[1].done());
  if (p == 1) return;
  expect_bf16_sum(a, 0, p, c.handle(Group::data));
  expect_bf16_sum(b, 0, p, c.handle(Group::data));
  EXPECT_EQ(c.counters()[Group::data].collective, (2 * n + 7) * 2);
}

TEST(Bf16Sum, ReduceScatterBlockingAndNot) {
  Communicator c(MPI_COMM_WORLD, world_size(), 1, 1);
  const int p = c.size(Group::data), me = c.rank(Group::data);
  const std::size_t chunk = 777, mine = chunk * static_cast<std::size_t>(me);
  const std::vector<float> send = inputs(me, chunk * static_cast<std::size_t>(p));
  std::vector<float> blocking(chunk), nonblocking(chunk, -1.0f);
  c.reset_counters();
  c.reduce_scatter_sum(send.data(), blocking.data(), chunk, Group::data, ReduceDtype::bf16);
  {
    PendingOp op = c.ireduce_scatter_sum(send.data(), nonblocking.data(), chunk, Group::data, ReduceDtype::bf16);
    // The destructor waits and completes it.
  }
  EXPECT_EQ(c.counters()[Group::data].collective, 2 * chunk * p * 2);
  EXPECT_EQ(send, inputs(me, chunk * static_cast<std::size_t>(p))) << "the send buffer changed";
  if (p == 1) return;  // MPI on one rank: the rank's own values rounded
  // This rank's chunk of the sum: reference with the values of positions mine.. of every rank.
  std::vector<float> shifted_b = blocking, shifted_n = nonblocking;
  for (const auto* got : {&shifted_b, &shifted_n}) {
    std::size_t bad = 0;
    for (std::size_t k = 0; k < chunk; ++k) {
      double ref = 0, mag = 0;
      for (int r = 0; r < p; ++r) {
        const double x = comm::from_bf16(comm::to_bf16(value(r, mine + k)));
        ref += x;
        mag += std::abs(x);
      }
      if (!(std::abs((*got)[k] - ref) <= (p + 1) * 0x1p-8 * mag) && bad++ < 5)
        ADD_FAILURE() << "element " << k << ": " << (*got)[k] << ", the sum is " << ref;
    }
    EXPECT_EQ(bad, 0u);
  }
}

}  // namespace
}  // namespace tessera
