// The communicator on 1, 2 and 4 ranks: grid coordinates against the formula of DESIGN.md,
// collectives against closed forms, what the flight recorder sees of them, and agree() turning
// one rank's error into everyone's.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>

#include "comm/agree.hpp"
#include "mpi_test_util.hpp"
#include "comm/communicator.hpp"
#include "core/error.hpp"

namespace tessera {
namespace {

using tessera::test::world_size;

TEST(Communicator, GridFollowsTheRankFormula) {
  const int n = world_size();
  // Every factorisation n = dp * tp * pp.
  for (int tp = 1; tp <= n; ++tp)
    for (int pp = 1; pp <= n / tp; ++pp) {
      if (n % (tp * pp) != 0) continue;
      const int dp = n / (tp * pp);
      Communicator c(MPI_COMM_WORLD, dp, tp, pp);
      const auto g = c.coord();
      EXPECT_EQ(c.rank(), c.world_rank_of(g.data, g.tensor, g.pipeline));
      EXPECT_EQ(c.size(Group::data), dp);
      EXPECT_EQ(c.size(Group::tensor), tp);
      EXPECT_EQ(c.size(Group::pipeline), pp);
      // Members of my data group share my t and p: the sum of their world ranks is known.
      double sum = c.rank();
      c.allreduce_sum(&sum, 1, Group::data);
      double expected = 0;
      for (int d = 0; d < dp; ++d) expected += c.world_rank_of(d, g.tensor, g.pipeline);
      EXPECT_EQ(sum, expected);
      double tsum = c.rank();
      c.allreduce_sum(&tsum, 1, Group::tensor);
      expected = 0;
      for (int t = 0; t < tp; ++t) expected += c.world_rank_of(g.data, t, g.pipeline);
      EXPECT_EQ(tsum, expected);
      double psum = c.rank();
      c.allreduce_sum(&psum, 1, Group::pipeline);
      expected = 0;
      for (int p = 0; p < pp; ++p) expected += c.world_rank_of(g.data, g.tensor, p);
      EXPECT_EQ(psum, expected);
      EXPECT_EQ(c.layout(1), "dp=" + std::to_string(dp) + ",tp=" + std::to_string(tp) +
                                 ",pp=" + std::to_string(pp) + ",zero=1");
    }
}

TEST(Communicator, AllreduceSumsFloatsOfAnyLength) {
  const int n = world_size();
  Communicator c(MPI_COMM_WORLD, n, 1, 1);
  for (std::size_t len : {1u, 7u, 1000u, 1u << 20}) {
    std::vector<float> v(len);
    for (std::size_t i = 0; i < len; ++i) v[i] = static_cast<float>(c.rank() + 1) * static_cast<float>(i % 97);
    c.allreduce_sum(v.data(), len, Group::data);
    const float ranks_sum = static_cast<float>(n * (n + 1) / 2);
    for (std::size_t i = 0; i < len; i += 997) ASSERT_EQ(v[i], ranks_sum * static_cast<float>(i % 97));
  }
  double m = c.rank();
  c.allreduce_max(&m, 1, Group::world);
  EXPECT_EQ(m, n - 1);
}

TEST(Communicator, BroadcastsStrings) {
  Communicator c(MPI_COMM_WORLD, world_size(), 1, 1);
  std::string s = c.rank() == 0 ? std::string(100000, 'x') + "end" : "";
  c.broadcast(s, 0, Group::world);
  EXPECT_EQ(s.size(), 100003u);
  EXPECT_EQ(s.substr(s.size() - 3), "end");
}

TEST(Communicator, AllgathersStringsOfEveryLength) {
  const int n = world_size();
  Communicator c(MPI_COMM_WORLD, n, 1, 1);
  const auto all = c.allgather_strings(std::string(static_cast<std::size_t>(c.rank()), 'a') + "r" +
                                           std::to_string(c.rank()), Group::world);
  ASSERT_EQ(all.size(), static_cast<std::size_t>(n));
  for (int r = 0; r < n; ++r)
    EXPECT_EQ(all[static_cast<std::size_t>(r)], std::string(static_cast<std::size_t>(r), 'a') + "r" + std::to_string(r));
}

// The flight recorder sees every collective with its group's name, number and members (world
// ranks), and every transfer with its peer's world rank, in every layout.
TEST(Communicator, RecordsOperationsWithGroupsAndPeers) {
  const int n = world_size();
  for (int tp = 1; tp <= n; ++tp)
    for (int pp = 1; pp <= n / tp; ++pp) {
      if (n % (tp * pp) != 0) continue;
      Communicator c(MPI_COMM_WORLD, n / (tp * pp), tp, pp);
      for (Group g : {Group::world, Group::data, Group::tensor, Group::pipeline}) {
        const auto members = c.members(g);
        ASSERT_EQ(members.size(), static_cast<std::size_t>(c.size(g)));
        EXPECT_EQ(members[static_cast<std::size_t>(c.rank(g))], c.rank());
        if (c.size(g) == 1) continue;
        double x = 1.0;
        c.allreduce_sum(&x, 1, g);
        c.allreduce_sum(&x, 1, g);
        const auto s = comm::flight_recorder().snapshot();
        const comm::FlightOp& last = s.ops.back();
        EXPECT_STREQ(last.op, "allreduce");
        EXPECT_STREQ(last.group, group_name(g));
        EXPECT_EQ(last.seq, s.ops[s.ops.size() - 2].seq + 1);
        EXPECT_EQ(last.bytes, sizeof(double));
        EXPECT_GE(last.end, last.start);
        const auto group = std::find_if(s.groups.begin(), s.groups.end(), [&](const comm::FlightGroup& f) {
          return f.comm == c.handle(g);
        });
        ASSERT_NE(group, s.groups.end());
        EXPECT_EQ(group->members, members);
      }
      if (pp > 1) {
        // Each stage sends to the next and receives from the previous, around the ring.
        const int p = c.coord().pipeline;
        std::vector<float> out(3, 1.0f), in(3);
        PendingOp send = c.isend(out.data(), out.size(), (p + 1) % pp, 7, Group::pipeline);
        c.recv(in.data(), in.size(), (p + pp - 1) % pp, 7, Group::pipeline);
        send.wait();
        const auto s = comm::flight_recorder().snapshot();
        const comm::FlightOp& recv = s.ops.back();
        const comm::FlightOp& sent = s.ops[s.ops.size() - 2];
        EXPECT_STREQ(sent.op, "send");
        EXPECT_EQ(sent.peer, c.world_rank_in(Group::pipeline, (p + 1) % pp));
        EXPECT_GE(sent.end, sent.start);
        EXPECT_STREQ(recv.op, "recv");
        EXPECT_EQ(recv.peer, c.world_rank_in(Group::pipeline, (p + pp - 1) % pp));
        EXPECT_EQ(recv.seq, 1u);
        EXPECT_FALSE(comm::flight_recorder().waiting());
      }
    }
}

TEST(Communicator, AgreeThrowsTheLowestFailingRanksErrorEverywhere) {
  const int n = world_size();
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  EXPECT_NO_THROW(agree(MPI_COMM_WORLD, [] {}));
  const int failing = n - 1;  // only the last rank sees a problem
  try {
    agree(MPI_COMM_WORLD, [&] {
      if (rank >= failing) throw InputError("rank " + std::to_string(rank) + " failed");
    });
    FAIL() << "no exception";
  } catch (const InputError& e) {
    EXPECT_EQ(std::string(e.what()), "rank " + std::to_string(failing) + " failed");
  }
  // Any other exception becomes a runtime_error everywhere, with the same text.
  try {
    agree(MPI_COMM_WORLD, [&] {
      if (rank == 0) throw std::logic_error("bug on rank 0");
    });
    FAIL() << "no exception";
  } catch (const InputError&) {
    FAIL() << "not an input error";
  } catch (const std::runtime_error& e) {
    EXPECT_EQ(std::string(e.what()), "bug on rank 0");
  }
}

}  // namespace
}  // namespace tessera
