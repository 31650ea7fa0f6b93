// train/context_traffic.hpp's bytes of a context group against what the algorithms must send,
// worked out here from positions and hops rather than from the closed forms: the window's halo
// from the keys each rank's queries reach, the ring by moving the blocks around it. The
// all-to-all's and the ring's bytes are also checked against real runs' counters
// (Context.TrafficIsWhatTheRunCounts in tests/integration/test_context_runs.cpp).
#include <gtest/gtest.h>

#include <vector>

#include "train/context_traffic.hpp"

using namespace tessera;

namespace {

// A llama of 3 blocks, 8 heads (2 key/value heads) of width 4, micro-batches of 2 samples.
Config llama(int context, int ranks, ContextComm comm, int window = 0) {
  Config c;
  c.model.kind = ModelKind::llama;
  c.model.layers = 3;
  c.model.heads = 8;
  c.model.kv_heads = 2;
  c.model.width = 32;
  c.model.context = context;
  c.model.window = window;
  c.parallel.data = c.parallel.tensor = c.parallel.pipeline = 1;
  c.parallel.spatial = ranks;
  c.parallel.context_comm = comm;
  c.train.global_batch = 2;
  return c;
}

// Bytes of one position's keys and values (2 h_kv hd) over the 3 blocks and 2 samples.
constexpr double kPosition = 4.0 * 2 * 2 * 4 * 3 * 2;

}  // namespace

// Rank r's queries at positions [r n, (r+1) n) read the keys of the W most recent positions,
// j-W+1 .. j: every key of an earlier rank that one of them reads travels to it forward and again
// in backward (its key and value), and back once (their gradients).
TEST(ContextTraffic, TheHaloIsTheKeysTheQueriesReach) {
  const int n = 8, C = 4, T = n * C;
  for (int window : {1, 2, 5, n, n + 1, 2 * n + 3, T}) {
    SCOPED_TRACE(window);
    const ContextTraffic t = context_traffic(llama(T, C, ContextComm::ring, window), ModelShape{}, 0);
    ASSERT_EQ(t.ranks, C);
    for (int r = 0; r < C; ++r)
      for (int q = 0; q < C; ++q) {
        int keys = 0;  // keys of rank min(q, r) that the queries of rank max(q, r) read
        const int from = std::min(q, r), to = std::max(q, r);
        for (int i = from * n; i < (from + 1) * n && from != to; ++i) {
          bool read = false;
          for (int j = to * n; j < (to + 1) * n; ++j) read = read || (i <= j && i >= j - window + 1);
          keys += read ? 1 : 0;
        }
        EXPECT_EQ(t.between(q, r), (q < r ? 2 : 1) * keys * kPosition) << "from " << q << " to " << r;
      }
    EXPECT_EQ(t.loss_sums, 2 * 8.0);  // one micro-batch's two sums
  }
}

// Every rank's block of keys and values moves C-1 hops to the next rank forward; backward the
// blocks move C-1 hops again and their gradient accumulators C (home). Recomputation repeats the
// forward.
TEST(ContextTraffic, TheRingPassesEveryBlockAroundIt) {
  const int n = 4;
  for (int C : {2, 3, 4}) {
    for (bool recompute : {false, true}) {
      SCOPED_TRACE(testing::Message() << C << " ranks, recompute " << recompute);
      Config cfg = llama(n * C, C, ContextComm::ring);
      cfg.train.recompute = recompute;
      std::vector<double> moved(static_cast<std::size_t>(C * C), 0.0);
      const auto pass = [&](int hops) {  // every rank's block, `hops` times to the next rank
        for (int owner = 0; owner < C; ++owner)
          for (int hop = 0, at = owner; hop < hops; ++hop, at = (at + 1) % C)
            moved[static_cast<std::size_t>(at * C + (at + 1) % C)] += n * kPosition;
      };
      for (int forward = 0; forward < (recompute ? 2 : 1); ++forward) pass(C - 1);
      pass(C - 1);  // keys and values again
      pass(C);      // dK, dV
      const ContextTraffic t = context_traffic(cfg, ModelShape{}, 0);
      for (int r = 0; r < C; ++r)
        for (int q = 0; q < C; ++q) EXPECT_EQ(t.between(r, q), moved[static_cast<std::size_t>(r * C + q)]);
    }
  }
}

// The all-to-all moves every head of q, k, v and y (the llama's k and v repeated to all heads),
// 1/C to each rank, its own part included; kv_heads does not change it, recomputation adds a
// forward (4 of the 8 regroups).
TEST(ContextTraffic, TheAllToAllHandsEveryRankItsShare) {
  const int C = 4, T = 32;
  const ContextTraffic t = context_traffic(llama(T, C, ContextComm::all_to_all), ModelShape{}, 0);
  const double regroup = 4.0 * 2 * (T / C) * 8 * 4 * 3;  // B (T/C) h hd over 3 blocks, 2 samples
  for (int r = 0; r < C; ++r) {
    for (int q = 0; q < C; ++q) EXPECT_EQ(t.between(r, q), 8 * regroup / C);
    EXPECT_EQ(t.sent(r), 8 * regroup * (C - 1) / C);
    EXPECT_EQ(t.counted(r), 8 * regroup + t.loss_sums);
  }
  Config mha = llama(T, C, ContextComm::all_to_all);
  mha.model.kv_heads = 8;
  EXPECT_EQ(context_traffic(mha, ModelShape{}, 0).bytes, t.bytes);
  mha.train.recompute = true;
  EXPECT_EQ(context_traffic(mha, ModelShape{}, 0).sent(0), 1.5 * t.sent(0));
}

// Each pipeline stage counts its own blocks, the loss's sums only on the last stage; the counted
// total adds every group of the layout.
TEST(ContextTraffic, StagesCountTheirBlocksAndTheLastTheLoss) {
  Config cfg = llama(32, 2, ContextComm::all_to_all);
  cfg.model.layers = 4;
  cfg.parallel.pipeline = 2;
  cfg.parallel.stages = {1, 3};
  cfg.parallel.micro_batches = 2;
  cfg.parallel.data = 3;
  cfg.train.global_batch = 12;  // micro-batches of 2 samples
  const ContextTraffic first = context_traffic(cfg, ModelShape{}, 0), last = context_traffic(cfg, ModelShape{}, 1);
  EXPECT_EQ(first.blocks, 1);
  EXPECT_EQ(last.blocks, 3);
  EXPECT_EQ(first.loss_sums, 0.0);
  EXPECT_EQ(last.loss_sums, 2 * 2 * 8.0);
  EXPECT_EQ(3 * first.sent(0), last.sent(0));
  EXPECT_EQ(context_bytes_counted(cfg, ModelShape{}),
            3 * (2 * first.counted(0) + 2 * last.counted(0)));
  cfg.parallel.spatial = 1;
  EXPECT_EQ(context_bytes_counted(cfg, ModelShape{}), 0.0);
  EXPECT_TRUE(describe_context_traffic(cfg, ModelShape{}).empty());
}
