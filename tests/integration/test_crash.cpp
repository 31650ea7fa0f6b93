// A rank killed, or a second stop signal arriving, in the middle of a checkpoint write (the test
// hooks in io/checkpoint_file.cpp: TESSERA_TEST_KILL_IN_CHECKPOINT, TESSERA_TEST_SIGNAL_IN_CHECKPOINT).
// Oracles: `latest` names a whole checkpoint, that checkpoint opens, and continuing from it gives
// the uninterrupted run's losses.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>

#include "io/metrics_file.hpp"
#include "run_helpers.hpp"

namespace tessera::test {
namespace {

namespace fs = std::filesystem;

const std::string deck = std::string(TESSERA_SOURCE_DIR) + "/tests/integration/mlp_test.toml";
// 30 steps, a train row every step, evaluation and a checkpoint every 10 steps, all kept.
const std::string extra = "--set train.steps=30 --set checkpoint.every_steps=10 --set checkpoint.keep=0 ";

std::string every10_args(const std::string& out, const std::string& more = "") {
  return fmt::format("train {} --set data.path={} --set run.output_dir={} {}{}", deck,
                     fashion_mnist(), out, extra, more);
}

std::string latest(const std::string& run) {
  std::string name = read_file(run + "/checkpoints/latest");
  name.erase(std::remove(name.begin(), name.end(), '\n'), name.end());
  return name;
}

// The uninterrupted 2-rank run, made once.
const std::string& whole_run() {
  static const std::string dir = [] {
    const std::string d = fresh_dir("crash_whole");
    const RunResult r = tessera(2, every10_args(d));
    EXPECT_EQ(r.exit_code, 0) << r.output;
    return d;
  }();
  return dir;
}

// metrics.h5 of a finished 30-step run holds steps 1..30 once each, in order.
void expect_h5_history_whole(const std::string& run) {
  const auto steps = io::read_metrics_column(run + "/metrics.h5", "train", "step");
  ASSERT_EQ(steps.size(), 30u);
  for (std::size_t i = 0; i < steps.size(); ++i) EXPECT_EQ(steps[i], static_cast<double>(i + 1));
  EXPECT_EQ(io::read_metrics_column(run + "/metrics.h5", "eval", "step"),
            (std::vector<double>{10, 20, 30}));
}

TEST(Crash, KillOfOneRankMidCheckpointKeepsThePreviousOneAndResumes) {
  const std::string run = fresh_dir("kill_mid_checkpoint");
  const std::string ckpt = run + "/checkpoints/";
  const RunResult killed = shell("TESSERA_TEST_KILL_IN_CHECKPOINT=20 " + tessera_command(2, every10_args(run)));
  EXPECT_NE(killed.exit_code, 0) << killed.output;
  EXPECT_NE(killed.exit_code, 4) << killed.output;
  EXPECT_NE(killed.output.find("rank 1: TESSERA_TEST_KILL_IN_CHECKPOINT"), std::string::npos)
      << killed.output;

  // The write got as far as data in the temporary file, not as far as the rename.
  ASSERT_TRUE(fs::exists(ckpt + "step_00000020.h5.tmp"));
  EXPECT_GT(fs::file_size(ckpt + "step_00000020.h5.tmp"), 1024u);
  EXPECT_FALSE(fs::exists(ckpt + "step_00000020.h5"));
  EXPECT_EQ(latest(run), "step_00000010.h5");
  // The history up to the kill survives, in metrics.csv and in metrics.h5.
  EXPECT_EQ(train_losses(run).rbegin()->first, 20);
  const auto h5_steps = io::read_metrics_column(run + "/metrics.h5", "train", "step");
  ASSERT_EQ(h5_steps.size(), 20u);
  EXPECT_EQ(h5_steps.back(), 20.0);

  // The previous checkpoint opens, and the run continues from it (dropping the rows after
  // step 10 and the temporary) to the uninterrupted run's losses.
  const RunResult inspect = tessera(1, "inspect " + ckpt + "step_00000010.h5");
  EXPECT_EQ(inspect.exit_code, 0) << inspect.output;
  const RunResult resumed = tessera(2, every10_args(run, "--resume auto"));
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_NE(resumed.output.find(fmt::format("resumed from {}step_00000010.h5 at step 10", ckpt)),
            std::string::npos) << resumed.output;
  EXPECT_FALSE(fs::exists(ckpt + "step_00000020.h5.tmp"));
  EXPECT_LE(max_relative_difference(train_losses(whole_run()), train_losses(run)), 1e-7);
  expect_h5_history_whole(run);
}

// A stop signal arrives while the step-10 checkpoint is written, so every rank stops after step
// 11; a second one arrives while that final checkpoint is written. The handler only records
// signals (src/train/stop_signal.cpp, SA_RESTART), so neither write is disturbed.
TEST(Crash, SecondSignalDuringTheStopCheckpointLeavesItWhole) {
  const std::string run = fresh_dir("signal_mid_checkpoint");
  const std::string ckpt = run + "/checkpoints/";
  const RunResult r = shell("TESSERA_TEST_SIGNAL_IN_CHECKPOINT=10,11 " + tessera_command(2, every10_args(run)));
  ASSERT_EQ(r.exit_code, 4) << r.output;
  EXPECT_EQ(count(r.output, "stop requested by signal: stopping after step 11,"), 1) << r.output;
  EXPECT_EQ(latest(run), "step_00000011.h5");
  for (const char* name : {"step_00000010.h5", "step_00000011.h5"}) {
    const RunResult inspect = tessera(1, fmt::format("inspect {}{}", ckpt, name));
    EXPECT_EQ(inspect.exit_code, 0) << inspect.output;
  }
  for (const auto& e : fs::directory_iterator(ckpt))
    EXPECT_NE(e.path().extension(), ".tmp") << e.path();

  const RunResult resumed = tessera(2, every10_args(run, "--resume auto"));
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("at step 11"), std::string::npos) << resumed.output;
  EXPECT_LE(max_relative_difference(train_losses(whole_run()), train_losses(run)), 1e-7);
  expect_h5_history_whole(run);
}

}  // namespace
}  // namespace tessera::test
