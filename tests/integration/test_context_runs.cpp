// End-to-end: context parallelism (parallel.spatial = C > 1) of the gpt and the llama on the test
// deck, both forms (parallel.context_comm: all_to_all and ring), against the one-rank runs; the
// bytes the context groups move against `tessera check`'s and `tessera plan`'s formulas.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <fstream>
#include <map>
#include <regex>
#include <string>
#include <vector>

#include "gpt_runs_util.hpp"

namespace tessera::test {
namespace {

// Context parallelism (parallel.spatial = C: each rank holds T/C positions of every sequence;
// the attention regroups by heads through all-to-alls, nn/context_parallel.cpp, or passes keys
// and values around a ring, nn/context_ring.cpp): the gpt at C = 2 and 4, the llama at C = 2 with
// tensor 2, with pipeline 2 and recomputation and micro-batches, and with data 2 and ZeRO 3: the
// one-rank losses within 1e-5 and its parameters, also under a sliding window of 12 (the
// all-to-all at C = 2, the ring's halo at C = 2 and 4: two ranks back, and with tensor 2); the ring
// with data 2 and hybrid ZeRO 2 (zero_group = node); under bf16 (fp32 activations, bf16 products)
// within 1e-3 of fp32. A checkpoint written by the ring at C = 4 resumes on one rank to the
// one-rank run.
TEST(Gpt, ContextParallelRanksTrainTheSameModel) {
  struct Case {
    int ranks;
    bool llama;
    std::string args, name, ref = {};  // ref: the one-rank run, where not the gpt's or the llama's
  };
  const std::string ref_llama = fresh_dir("cp_llama_ref");
  ASSERT_EQ(tessera(1, llama_args(ref_llama)).exit_code, 0);
  // A sliding window of 12 (of 32) positions: 11 keys back, so at C = 4 (8 positions per rank)
  // the ring's halo comes from two ranks back.
  const std::string window = "--set model.window=12", ref_window = fresh_dir("cp_window_ref");
  ASSERT_EQ(tessera(1, gpt_args(ref_window, window)).exit_code, 0);
  const double window_moved = max_relative_difference(train_losses(reference()), train_losses(ref_window));
  std::printf("window 12: largest relative loss difference from full attention %.3g\n", window_moved);
  EXPECT_GT(window_moved, 1e-4);  // a window that did nothing: 0
  // Both forms: the all-to-all (the default) and the ring (head and tail chunks), each alone at
  // C = 2 and 4 and with tensor, pipeline (recompute, micro-batches) and data (ZeRO 3).
  const std::string ring = " --set parallel.context_comm=ring";
  const std::vector<Case> cases = {
      {2, false, "--set parallel.spatial=2", "gpt_c2"},
      {4, false, "--set parallel.spatial=4", "gpt_c4"},
      {2, false, "--set parallel.spatial=2" + ring, "gpt_c2_ring"},
      {4, false, "--set parallel.spatial=4" + ring, "gpt_c4_ring"},
      {4, true, layout(1, 2, 1) + " --set parallel.spatial=2", "llama_t2c2"},
      {4, true, layout(1, 2, 1) + " --set parallel.spatial=2" + ring, "llama_t2c2_ring"},
      {4, true, layout(1, 1, 2) + " --set parallel.spatial=2 --set train.recompute=true --set parallel.micro_batches=2",
       "llama_p2c2_recompute"},
      {4, true,
       layout(1, 1, 2) + " --set parallel.spatial=2 --set train.recompute=true --set parallel.micro_batches=2" + ring,
       "llama_p2c2_recompute_ring"},
      {4, true, layout(2, 1, 1) + " --set parallel.spatial=2 --set parallel.zero=3", "llama_d2c2_zero3"},
      {4, true, layout(2, 1, 1) + " --set parallel.spatial=2 --set parallel.zero=3" + ring, "llama_d2c2_zero3_ring"},
      {2, false, window + " --set parallel.spatial=2", "gpt_window12_c2", ref_window},
      {2, false, window + " --set parallel.spatial=2" + ring, "gpt_window12_c2_halo", ref_window},
      {4, false, window + " --set parallel.spatial=4" + ring, "gpt_window12_c4_halo", ref_window},
      {4, false, window + " " + layout(1, 2, 1) + " --set parallel.spatial=2" + ring, "gpt_window12_t2c2_halo",
       ref_window},
      {4, false,
       layout(2, 1, 1) + " --set parallel.spatial=2 --set parallel.zero=2 --set parallel.zero_group=node" + ring,
       "gpt_d2c2_zero2_hybrid_ring"},
  };
  std::string gpt_c4_ring;
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const std::string dir = fresh_dir("cp_" + c.name),
                      ref = !c.ref.empty() ? c.ref : c.llama ? ref_llama : reference();
    if (c.name == "gpt_c4_ring") gpt_c4_ring = dir;
    const RunResult r = tessera(c.ranks, c.llama ? llama_args(dir, c.args) : gpt_args(dir, c.args));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    ASSERT_EQ(train_losses(dir).size(), 30u);
    expect_same_run(dir, ref);
    if (c.name == "gpt_c2_ring") {
      // summary.json's "context": per step and rank, keys and values of B = 8 samples x T/C = 16
      // positions x 2 x 64 values, sent (C-1) times forward and 2C-1 backward, in 2 blocks.
      const auto j = nlohmann::json::parse(read_file(dir + "/summary.json"));
      ASSERT_TRUE(j.contains("context")) << j.dump();
      EXPECT_EQ(j["context"]["form"], "ring");
      EXPECT_DOUBLE_EQ(j["context"]["bytes_per_step"].get<double>(), 2.0 * (1 + 3) * 8 * 16 * 2 * 64 * 4);
      EXPECT_GE(j["context"]["wait_s_per_step"].get<double>(), 0.0);
    }
  }
  const std::string bf16 = fresh_dir("cp_llama_bf16");
  const RunResult b = tessera(2, llama_args(bf16, "--set parallel.spatial=2 --set train.precision=bf16" + ring));
  ASSERT_EQ(b.exit_code, 0) << b.output;
  const double diff = max_relative_difference(train_losses(ref_llama), train_losses(bf16));
  std::printf("llama bf16, ring C = 2: largest relative loss difference from fp32 %.3g\n", diff);
  EXPECT_LE(diff, 1e-3);
  EXPECT_GT(diff, 0.0);
  // Step 15's checkpoint of the C = 4 ring gpt, resumed on one rank.
  const std::string resumed = fresh_dir("cp_resume");
  const RunResult r = tessera(1, gpt_args(resumed, "--resume " + gpt_c4_ring + "/checkpoints/step_00000015.h5"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto ref = train_losses(reference()), tail = train_losses(resumed);
  ASSERT_EQ(tail.size(), 15u);
  EXPECT_EQ(tail.begin()->first, 16);
  EXPECT_LE(max_relative_difference(std::map<std::int64_t, double>(ref.find(16), ref.end()), tail), 1e-5);
}

// A context one rank cannot hold under run.memory_limit_mb trains on two ring ranks: the one-rank
// run is refused before it starts (one line naming parallel.spatial), the ring's measured
// activation peak per rank is under the limit and under a third of the one-rank estimate (its
// T x T scores gone, the rest halved).
TEST(Context, ALongContextOneRankCannotHoldTrainsOnTwoRingRanks) {
  const std::string llama = "--set model.kind=llama --set model.layers=2 --set model.width=64 --set model.heads=4 "
                            "--set model.kv_heads=2 --set model.ffn_width=128 --set model.context=1024 "
                            "--set train.global_batch=2 --set train.steps=2 --set eval.every_steps=0 "
                            "--set eval.at_end=false --set checkpoint.every_steps=0 --set checkpoint.at_end=false "
                            "--set run.memory_limit_mb=60";
  const RunResult one = tessera_alone(gpt_args(fresh_dir("long_one"), llama));
  ASSERT_EQ(one.exit_code, 2) << one.output;
  EXPECT_NE(one.output.find("run.memory_limit_mb = 60"), std::string::npos) << one.output;
  EXPECT_NE(one.output.find("parallel.spatial"), std::string::npos) << one.output;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(one.output, m, std::regex(R"(needs about ([0-9.]+) MB)"))) << one.output;
  const double one_rank = std::stod(m[1].str()) * 1e6;
  const std::string dir = fresh_dir("long_ring");
  const RunResult ring =
      tessera(2, gpt_args(dir, llama + " --set parallel.spatial=2 --set parallel.context_comm=ring"));
  ASSERT_EQ(ring.exit_code, 0) << ring.output;
  EXPECT_EQ(train_losses(dir).size(), 2u);
  const std::string summary = read_file(dir + "/summary.json");
  ASSERT_TRUE(std::regex_search(summary, m, std::regex(R"("act_peak_bytes": ([0-9.e+]+))"))) << summary;
  const double peak = std::stod(m[1].str());
  std::printf("context 1024: one rank needs %.1f MB, each of 2 ring ranks peaked at %.1f MB of activations\n",
              one_rank / 1e6, peak / 1e6);
  EXPECT_LT(peak, 60e6);
  EXPECT_LT(peak, one_rank / 3);
}

// What a run's ranks hand to their context groups per training step as the Communicator counts
// it (summary.json's comm.bytes_per_step_by_group.spatial, summed over the ranks) equals, to the
// byte, what `tessera check` predicts by train/context_traffic.hpp's formulas: the all-to-all and
// the ring, with recomputation and micro-batches, the llama's shared key/value heads and the gpt's;
// `tessera plan` puts a rank's sends on the node link when the group's 2 ranks sit on 2 nodes,
// nothing on 1 node; also the ring's halo under a window (9: 8 positions from the other rank; 20 with
// recomputation: 16, a whole block). 3 steps on 2 ranks per case.
TEST(Context, TrafficIsWhatTheRunCounts) {
  struct Case {
    bool llama;
    std::string args;
  };
  const std::vector<Case> cases = {
      {true, "--set parallel.spatial=2"},
      {true, "--set parallel.spatial=2 --set train.recompute=true --set parallel.micro_batches=2"},
      {true, "--set parallel.spatial=2 --set parallel.context_comm=ring"},
      {true, "--set parallel.spatial=2 --set parallel.context_comm=ring --set train.recompute=true "
             "--set parallel.micro_batches=2"},
      {false, "--set parallel.spatial=2 --set parallel.context_comm=ring"},
      {false, "--set parallel.spatial=2 --set parallel.context_comm=ring --set model.window=9"},
      {true, "--set parallel.spatial=2 --set parallel.context_comm=ring --set model.window=20 "
             "--set train.recompute=true"},
  };
  const std::string three_steps = "--set train.steps=3 --set eval.every_steps=0 --set eval.at_end=false "
                                  "--set checkpoint.every_steps=0 --set checkpoint.at_end=false ";
  for (const Case& c : cases) {
    SCOPED_TRACE(c.args);
    const std::string dir = fresh_dir("context_traffic");
    const std::string train = c.llama ? llama_args(dir, three_steps + c.args) : gpt_args(dir, three_steps + c.args);
    const std::string deck = train.substr(std::string("train").size());
    const RunResult check = tessera_alone("check" + deck + " --ranks 2");
    ASSERT_EQ(check.exit_code, 0) << check.output;
    std::smatch counted, sent;
    ASSERT_TRUE(std::regex_search(check.output, counted, std::regex(R"(all ranks hand ([0-9]+) bytes per step)")))
        << check.output;
    ASSERT_TRUE(std::regex_search(check.output, sent, std::regex(R"(sends ([0-9.]+) MB per step)"))) << check.output;
    const RunResult r = tessera(2, train);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    std::ifstream in(dir + "/summary.json");
    const auto summary = nlohmann::json::parse(in);
    EXPECT_EQ(summary["comm"]["bytes_per_step_by_group"]["spatial"].get<double>(), std::stod(counted[1].str()))
        << check.output;
    for (const auto& [per_node, link] : {std::pair{1, std::stod(sent[1].str())}, std::pair{2, 0.0}}) {
      const RunResult plan =
          tessera_alone(fmt::format("plan{} --nodes {} --gpus-per-node {} --link-gbps 1 --compute-s 1", deck,
                                    2 / per_node, per_node));
      ASSERT_EQ(plan.exit_code, 0) << plan.output;
      std::smatch m;
      ASSERT_TRUE(std::regex_search(plan.output, m, std::regex(R"(node link carries ([0-9.]+) MB)"))) << plan.output;
      EXPECT_NEAR(std::stod(m[1].str()), link, 0.006) << plan.output;
    }
  }
}

}  // namespace
}  // namespace tessera::test
