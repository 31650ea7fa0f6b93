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
