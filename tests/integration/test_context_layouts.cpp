// End-to-end: context parallelism (parallel.spatial = C > 1) of the gpt and the llama on the test
// deck, both forms (parallel.context_comm: all_to_all and ring) and the ring's window halo, alone
// and with the other parallelisms, against the one-rank runs. Labelled "layouts": the Release
// pass runs it; the sanitizer pass leaves it out (docs/testing.md, "The sanitizer pass's scope").
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <map>
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

}  // namespace
}  // namespace tessera::test
