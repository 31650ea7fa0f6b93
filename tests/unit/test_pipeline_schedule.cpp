// Pipeline schedules (train/pipeline.hpp) run in a simulated pipeline: every op once, every
// receive after its send, the executor's bound on live slots (slot_bound) kept without a
// deadlock even where a send completes only once its receive is posted, and the bubble each
// schedule leaves.
#include <gtest/gtest.h>

#include <algorithm>
#include <deque>
#include <map>
#include <set>
#include <tuple>
#include <vector>

#include "train/pipeline.hpp"

namespace tessera {
namespace {

using K = PipelineOp::Kind;

struct Simulated {
  bool finished = false;
  int rounds = 0;                // time steps until every stage is done (one op per step)
  std::vector<int> peak_live;    // per stage, slots held at once (retiring ones included)
};

// Runs every stage's ops, one per time step where it can: a forward of model chunk j (chunk c of
// stage s: j = c * stages + s) needs chunk j - 1's forward of its micro-batch one step earlier
// (its activation), a backward needs chunk j + 1's backward (its gradient) or, on the model's
// last chunk, its own forward (the loss). A forward first keeps the stage within `bound` live
// slots as the executor does: a slot whose backward is done retires, and is freed once the
// gradient it sent back was received (rendezvous: the oldest waited for first), or at once
// (eager sends: what the bubble is measured with). `bound` of a stage's ops: slot_bound, or
// another rule to try.
using Bound = int (*)(const std::vector<PipelineOp>& ops, int chunks);
Simulated simulate(PipelineSchedule kind, int stages, int micro, int chunks, bool rendezvous = true,
                   Bound rule = slot_bound) {
  const int J = stages * chunks;
  std::vector<std::vector<PipelineOp>> ops;
  std::vector<int> bound;
  for (int s = 0; s < stages; ++s) {
    ops.push_back(pipeline_schedule(kind, stages, s, micro, chunks));
    bound.push_back(rule(ops.back(), chunks));
  }
  std::map<std::tuple<K, int, int>, int> done;  // (kind, chunk j, micro) -> step it ran
  const auto ran_before = [&](K k, int j, int m, int step) {
    const auto it = done.find({k, j, m});
    return it != done.end() && it->second < step;
  };
  struct Stage {
    std::size_t next = 0;
    int unretired = 0;
    std::deque<std::pair<int, int>> retiring;  // (chunk j the gradient went to, micro); j < 0: none
  };
  std::vector<Stage> st(static_cast<std::size_t>(stages));
  Simulated sim;
  sim.peak_live.assign(static_cast<std::size_t>(stages), 0);
  for (int step = 0;; ++step) {
    bool all_done = true, progress = false;
    for (int s = 0; s < stages; ++s) {
      Stage& x = st[static_cast<std::size_t>(s)];
      const auto& mine = ops[static_cast<std::size_t>(s)];
      if (x.next == mine.size()) continue;
      all_done = false;
      const PipelineOp op = mine[x.next];
      const int j = op.chunk * stages + s;
      const auto received = [&](const std::pair<int, int>& r) {
        return !rendezvous || r.first < 0 || ran_before(K::backward, r.first, r.second, step);
      };
      if (op.kind == K::forward) {
        while (!x.retiring.empty() && received(x.retiring.front())) x.retiring.pop_front();
        if (x.unretired + static_cast<int>(x.retiring.size()) >= bound[static_cast<std::size_t>(s)] &&
            !x.retiring.empty())
          continue;  // waits for the oldest retiring slot's send
        if (j > 0 && !ran_before(K::forward, j - 1, op.micro, step)) continue;
        ++x.unretired;
      } else {
        if (!ran_before(j + 1 < J ? K::backward : K::forward, j + 1 < J ? j + 1 : j, op.micro, step)) continue;
        --x.unretired;
        x.retiring.emplace_back(j > 0 ? j - 1 : -1, op.micro);
      }
      done[{op.kind, j, op.micro}] = step;
      ++x.next;
      progress = true;
      sim.peak_live[static_cast<std::size_t>(s)] =
          std::max(sim.peak_live[static_cast<std::size_t>(s)], x.unretired + static_cast<int>(x.retiring.size()));
    }
    if (all_done) {
      sim.finished = true;
      sim.rounds = step;
      return sim;
    }
    if (!progress) return sim;  // nothing ran: the next step would see the same, a deadlock
  }
}

TEST(PipelineSchedule, OneFOneBAndGpipeKeepTheirOrder) {
  const std::vector<PipelineOp> one_f_one_b = {{K::forward, 0}, {K::forward, 1}, {K::backward, 0},
                                               {K::forward, 2}, {K::backward, 1}, {K::forward, 3},
                                               {K::backward, 2}, {K::backward, 3}};
  EXPECT_EQ(pipeline_schedule(PipelineSchedule::one_f_one_b, 2, 0, 4), one_f_one_b);
  EXPECT_EQ(peak_in_flight(pipeline_schedule(PipelineSchedule::one_f_one_b, 4, 0, 8)), 4);
  EXPECT_EQ(peak_in_flight(pipeline_schedule(PipelineSchedule::one_f_one_b, 4, 3, 8)), 1);
  EXPECT_EQ(peak_in_flight(pipeline_schedule(PipelineSchedule::gpipe, 4, 2, 8)), 8);
}

TEST(PipelineSchedule, EveryOpOnceInEveryLayout) {
  for (const auto kind : {PipelineSchedule::gpipe, PipelineSchedule::one_f_one_b})
    for (int stages : {1, 2, 3, 4})
      for (int chunks : {1, 2, 3})
        for (int micro : {1, 2, 3, 4, 6, 8, 12}) {
          if (chunks > 1 && (kind == PipelineSchedule::gpipe || stages < 2 || micro % stages != 0)) continue;
          for (int s = 0; s < stages; ++s) {
            SCOPED_TRACE(testing::Message() << "stages " << stages << " stage " << s << " chunks " << chunks
                                            << " micro " << micro);
            const auto ops = pipeline_schedule(kind, stages, s, micro, chunks);
            std::set<std::tuple<K, int, int>> seen;
            for (const auto& op : ops) {
              EXPECT_TRUE(op.micro >= 0 && op.micro < micro && op.chunk >= 0 && op.chunk < chunks);
              EXPECT_TRUE(seen.insert({op.kind, op.chunk, op.micro}).second) << "an op twice";
            }
            EXPECT_EQ(seen.size(), static_cast<std::size_t>(2 * micro * chunks));
            // Each chunk's forward of a micro-batch comes before its backward.
            for (const auto& op : ops)
              if (op.kind == K::backward) {
                const auto f = std::find(ops.begin(), ops.end(), PipelineOp{K::forward, op.micro, op.chunk});
                const auto b = std::find(ops.begin(), ops.end(), op);
                EXPECT_LT(f - ops.begin(), b - ops.begin());
              }
          }
        }
}

TEST(PipelineSchedule, InterleavedRefusesWhatItCannotRun) {
  EXPECT_THROW(pipeline_schedule(PipelineSchedule::gpipe, 2, 0, 4, 2), std::invalid_argument);
  EXPECT_THROW(pipeline_schedule(PipelineSchedule::one_f_one_b, 2, 0, 3, 2), std::invalid_argument);
  EXPECT_THROW(pipeline_schedule(PipelineSchedule::one_f_one_b, 2, 0, 4, 0), std::invalid_argument);
  // One stage would send a chunk's gradient to itself, and wait for it before its own receive.
  EXPECT_THROW(pipeline_schedule(PipelineSchedule::one_f_one_b, 1, 0, 4, 2), std::invalid_argument);
}

TEST(PipelineSchedule, InterleavedOrderOfTwoStagesTwoChunks) {
  // Megatron's interleaved 1F1B for p = 2, v = 2, m = 4: micro-batches in groups of 2, chunk 0
  // of a group then chunk 1; stage 0 warms up with 2 (p - 1) + (v - 1) p = 4 forwards.
  const auto F = [](int m, int c) { return PipelineOp{K::forward, m, c}; };
  const auto B = [](int m, int c) { return PipelineOp{K::backward, m, c}; };
  const std::vector<PipelineOp> stage0 = {F(0, 0), F(1, 0), F(0, 1), F(1, 1), F(2, 0), B(0, 1), F(3, 0), B(1, 1),
                                          F(2, 1), B(0, 0), F(3, 1), B(1, 0), B(2, 1), B(3, 1), B(2, 0), B(3, 0)};
  EXPECT_EQ(pipeline_schedule(PipelineSchedule::one_f_one_b, 2, 0, 4, 2), stage0);
  EXPECT_EQ(peak_in_flight(stage0), 5);
  EXPECT_EQ(slot_bound(stage0, 2), 6);
  EXPECT_EQ(slot_bound(pipeline_schedule(PipelineSchedule::one_f_one_b, 2, 0, 4), 1), 2);
  EXPECT_EQ(peak_in_flight(pipeline_schedule(PipelineSchedule::one_f_one_b, 2, 1, 4, 2)), 3);
}

TEST(PipelineSchedule, SimulatedRunsFinishWithinTheirBoundAndBubble) {
  for (const auto kind : {PipelineSchedule::gpipe, PipelineSchedule::one_f_one_b})
    for (int stages : {1, 2, 3, 4, 8})
      for (int chunks : {1, 2, 3, 4})
        for (int micro : {1, 2, 3, 4, 6, 8, 12, 16, 24}) {
          if (chunks > 1 && (kind == PipelineSchedule::gpipe || stages < 2 || micro % stages != 0)) continue;
          SCOPED_TRACE(testing::Message() << "stages " << stages << " chunks " << chunks << " micro " << micro);
          const Simulated sim = simulate(kind, stages, micro, chunks);
          ASSERT_TRUE(sim.finished) << "deadlock";
          for (int s = 0; s < stages; ++s)
            EXPECT_LE(sim.peak_live[static_cast<std::size_t>(s)],
                      slot_bound(pipeline_schedule(kind, stages, s, micro, chunks), chunks));
          // Each stage runs 2 m v ops of equal length; the rest of the run is its bubble. 1F1B and
          // GPipe take the ideal 2 (p - 1) steps more: (p - 1) / (m + p - 1) of the run; the
          // interleaved schedule at most 2 (v - 1) steps beyond its ideal (p - 1) / (v m + p - 1).
          const Simulated eager = simulate(kind, stages, micro, chunks, false);
          ASSERT_TRUE(eager.finished);
          const int work = 2 * micro * chunks;
          EXPECT_GE(eager.rounds, work + 2 * (stages - 1));
          EXPECT_LE(eager.rounds, work + 2 * (stages - 1) + 2 * (chunks - 1));
          if (chunks == 1) {
            EXPECT_EQ(eager.rounds, work + 2 * (stages - 1));
          }
        }
}

TEST(PipelineSchedule, InterleavedNeedsOneSlotMoreThanItsPeak) {
  // At the schedule's peak alone, p = 2, v = 2, m = 4 deadlocks with rendezvous sends: stage 0
  // waits for stage 1 to receive a gradient that stage 1 receives after its next forward, which
  // waits for stage 0 to receive one in turn.
  const Bound peak_only = [](const std::vector<PipelineOp>& ops, int) { return peak_in_flight(ops); };
  EXPECT_FALSE(simulate(PipelineSchedule::one_f_one_b, 2, 4, 2, true, peak_only).finished);
  EXPECT_TRUE(simulate(PipelineSchedule::one_f_one_b, 2, 4, 2).finished);
  EXPECT_TRUE(simulate(PipelineSchedule::one_f_one_b, 4, 8, 1, true, peak_only).finished);
}

TEST(PipelineSchedule, InterleavingShrinksTheBubble) {
  // p = 4, m = 8: 1F1B idles 2 (p - 1) = 6 of 22 steps, each step a whole stage's forward or
  // backward: 3/11 of the run; interleaved over v = 2 chunks a step is half of that, and the
  // idle share falls towards 3/19.
  const Simulated one = simulate(PipelineSchedule::one_f_one_b, 4, 8, 1, false);
  const Simulated two = simulate(PipelineSchedule::one_f_one_b, 4, 8, 2, false);
  ASSERT_TRUE(one.finished);
  ASSERT_TRUE(two.finished);
  const double bubble_one = double(one.rounds - 16) / one.rounds;
  const double bubble_two = double(two.rounds - 32) / two.rounds;
  EXPECT_NEAR(bubble_one, 3.0 / 11.0, 1e-12);
  EXPECT_LT(bubble_two, bubble_one);
  EXPECT_LE(bubble_two, 5.0 / 21.0);  // 2 (p - 1) + 2 (v - 1) = 8 idle of 40 steps at most
}

}  // namespace
}  // namespace tessera
