// End-to-end: one model, any layout. Every (data, tensor, pipeline) layout, schedule and
// micro-batch count trains the 1-rank run's losses and ends at its parameters (tessera diff);
// a checkpoint of the 8-rank layout resumes on others; the pipeline keeps to its schedule's
// bound on live activations; interleaved stages (parallel.virtual_stages) train the same model,
// and their checkpoints resume without them and the other way round.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>

#include "run_helpers.hpp"

namespace tessera::test {
namespace {

namespace fs = std::filesystem;

struct Layout {
  int dp, tp, pp;
  int ranks() const { return dp * tp * pp; }
  std::string args() const {
    return fmt::format("--set parallel.data={} --set parallel.tensor={} --set parallel.pipeline={}", dp, tp, pp);
  }
  std::string name() const { return fmt::format("dp{}tp{}pp{}", dp, tp, pp); }
};

const std::vector<Layout> kLayouts = {{1, 1, 1}, {2, 1, 1}, {1, 2, 1}, {1, 1, 2},
                                      {2, 2, 1}, {2, 1, 2}, {1, 2, 2}, {2, 2, 2}};

nlohmann::json summary(const std::string& dir) {
  std::ifstream in(dir + "/summary.json");
  return nlohmann::json::parse(in);
}

// `tessera diff` of the two runs' final checkpoints within 1e-5 relative (exit 0).
void expect_same_parameters(const std::string& a, const std::string& b) {
  const std::string ckpt = "/checkpoints/step_00000030.h5";
  const RunResult d = tessera(1, "diff " + a + ckpt + " " + b + ckpt + " --tolerance 1e-5");
  EXPECT_EQ(d.exit_code, 0) << d.output;
}

TEST(Layouts, EveryLayoutScheduleAndMicroBatchCountTrainsTheSameModel) {
  const std::string& ref = shared_run(1);
  const auto ref_losses = train_losses(ref);
  ASSERT_EQ(ref_losses.size(), 30u);
  for (const Layout& l : kLayouts)
    for (const char* schedule : {"1f1b", "gpipe"})
      for (int micro : {1, 4}) {
        if (l.pp == 1 && std::string(schedule) == "gpipe") continue;  // no pipeline, no schedule
        if (l.ranks() == 1 && micro == 1) continue;                     // the reference
        const std::string what = fmt::format("{} {} micro_batches={}", l.name(), schedule, micro);
        SCOPED_TRACE(what);
        const std::string dir = fresh_dir(fmt::format("{}_{}_m{}", l.name(), schedule, micro));
        const RunResult r = tessera(l.ranks(), train_args(dir, fmt::format("{} --set parallel.schedule={} "
                                                                           "--set parallel.micro_batches={}",
                                                                           l.args(), schedule, micro)));
        ASSERT_EQ(r.exit_code, 0) << r.output;
        EXPECT_LE(max_relative_difference(ref_losses, train_losses(dir)), 1e-5);
        EXPECT_LE(max_relative_difference(eval_losses(ref), eval_losses(dir)), 1e-5);
        expect_same_parameters(ref, dir);
        // The runtime's own count of live activation slots: GPipe holds every micro-batch,
        // 1F1B at most one per stage.
        const int peak = summary(dir)["peak_activation_slots"].get<int>();
        if (l.pp > 1 && std::string(schedule) == "gpipe") EXPECT_EQ(peak, micro);
        else EXPECT_LE(peak, std::max(1, std::min(micro, l.pp)));
      }
}

TEST(Layouts, ZeroStagesOnModelParallelLayouts) {
  expect_layout_invariant("zero_mp", "",
                          {{4, "--set parallel.tensor=2 --set parallel.zero=3 --set comm.bucket_mb=0.005"},
                           {4, "--set parallel.pipeline=2 --set parallel.zero=2 --set parallel.micro_batches=4"},
                           {8, "--set parallel.tensor=2 --set parallel.pipeline=2 --set parallel.zero=1"}});
  // One hidden layer: the row-parallel layer is the last of its bucket, so ZeRO-3 releases its
  // values at after_forward; its bias must be added (after the tensor sum) before that.
  expect_layout_invariant("zero3_row_last", "--set model.hidden=[64]",
                          {{4, "--set parallel.tensor=2 --set parallel.zero=3"}});
}

// Four layers: two stages of two chunks each.
const std::string kFourLayers = "--set model.hidden=[64,32,32]";
std::string interleaved(int v, int micro) {
  return fmt::format("--set parallel.pipeline=2 --set parallel.virtual_stages={} --set parallel.micro_batches={}",
                     v, micro);
}

// The 1-rank run of the four-layer model, trained once (shared_run) for the two cases below.
TEST(Layouts, InterleavedStagesTrainTheSameModel) {
  const std::string& ref = shared_run(1, kFourLayers);
  const std::vector<std::pair<int, std::string>> cases = {
      {2, interleaved(2, 4)},
      {2, interleaved(2, 2)},
      {4, interleaved(2, 2) + " --set parallel.data=2 --set parallel.zero=3"},
      {4, interleaved(2, 4) + " --set parallel.tensor=2 --set parallel.zero=1 --set comm.no_sync=false"}};
  for (std::size_t i = 0; i < cases.size(); ++i) {
    const auto& [ranks, args] = cases[i];
    SCOPED_TRACE(args);
    const std::string dir = fresh_dir(fmt::format("interleaved_{}", i));
    const RunResult r = tessera(ranks, train_args(dir, kFourLayers + " " + args));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_LE(max_relative_difference(train_losses(ref), train_losses(dir)), 1e-5);
    EXPECT_LE(max_relative_difference(eval_losses(ref), eval_losses(dir)), 1e-5);
    expect_same_parameters(ref, dir);
    // A slot holds one chunk of a micro-batch. With m = 4, stage 0 of 2 warms up with
    // 2 (p - 1) + (v - 1) p = 4 forwards and holds 5 at the schedule's peak, stage 1 (2 forwards)
    // 3; a retired slot whose send is in flight may add one (slot_bound). 1F1B without chunks
    // would hold 2 and 1.
    const auto peaks = summary(dir)["peak_activation_slots_by_stage"];
    ASSERT_EQ(peaks.size(), 2u);
    EXPECT_LE(peaks[0].get<int>(), 6);
    EXPECT_LE(peaks[1].get<int>(), 4);
    if (i == 0) {
      EXPECT_GE(peaks[0].get<int>(), 5);
      EXPECT_GE(peaks[1].get<int>(), 3);
    }
  }
}

TEST(Layouts, CheckpointsResumeAcrossVirtualStages) {
  const std::string& whole = shared_run(1, kFourLayers);
  // Written under v = 2, resumed under v = 1; written under v = 1, resumed under v = 2.
  for (const auto& [write, resume] : {std::pair{interleaved(2, 2), interleaved(1, 2)},
                                      std::pair{interleaved(1, 2), interleaved(2, 2)}}) {
    SCOPED_TRACE(write + " then " + resume);
    const std::string dir = fresh_dir("virtual_resume");
    const RunResult w = tessera(2, train_args(dir, kFourLayers + " --set train.steps=20 " + write));
    ASSERT_EQ(w.exit_code, 0) << w.output;
    const RunResult r = tessera(2, train_args(dir, kFourLayers + " --set train.steps=30 --resume auto " + resume));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find("resumed from"), std::string::npos) << r.output;
    EXPECT_LE(max_relative_difference(train_losses(whole), train_losses(dir)), 1e-5);
  }
}

TEST(Layouts, CheckpointOfTheEightRankLayoutResumesOnOthers) {
  const std::string whole = fresh_dir("reshard_whole");
  ASSERT_EQ(tessera(1, train_args(whole, "--set train.steps=40")).exit_code, 0);
  const std::string first = fresh_dir("reshard_first");
  const Layout big{2, 2, 2};
  const RunResult w = tessera(8, train_args(first, "--set train.steps=20 --set parallel.micro_batches=2 " + big.args()));
  ASSERT_EQ(w.exit_code, 0) << w.output;
  for (const Layout& l : {Layout{1, 1, 1}, Layout{1, 2, 2}, Layout{4, 1, 1}}) {
    const std::string dir = fresh_dir("reshard_" + l.name());
    fs::copy(first, dir, fs::copy_options::recursive | fs::copy_options::overwrite_existing);
    const RunResult r = tessera(l.ranks(), train_args(dir, "--set train.steps=40 --resume auto " + l.args()));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find("resumed from"), std::string::npos) << r.output;
    EXPECT_LE(max_relative_difference(train_losses(whole), train_losses(dir)), 1e-5) << l.name();
  }
}

}  // namespace
}  // namespace tessera::test
