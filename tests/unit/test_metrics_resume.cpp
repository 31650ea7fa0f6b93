// metrics.csv and metrics.h5 when a run resumes (RunOutput with a resume step): the rows up to the
// step are kept, today's header is written, and a file written before a column was added (no
// tokens_per_s; no rel_l2 either, older still) keeps its rows, cells moved by column name and the
// new columns empty; metrics.h5 is rebuilt from the kept rows. tokens_per_s is written beside the
// other rates on train rows of a token model and left empty elsewhere.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "io/metrics_file.hpp"
#include "train/run_output.hpp"

namespace tessera {
namespace {

namespace fs = std::filesystem;

const std::string header =
    "kind,step,epoch,loss,lr,grad_norm,samples_per_s,accuracy,wall_s,t_data,t_forward,t_backward,"
    "t_allreduce,t_optimizer,t_tensor,t_pipeline,rel_l2,tokens_per_s";

class MetricsResume : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("tessera_test_metrics_resume_" + std::to_string(getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string dir() const { return dir_.string(); }
  std::string h5() const { return (dir_ / "metrics.h5").string(); }
  void write_csv(const std::string& text) const { std::ofstream(dir_ / "metrics.csv") << text; }
  std::vector<std::string> csv_lines() const {
    std::ifstream in(dir_ / "metrics.csv");
    std::vector<std::string> lines;
    for (std::string l; std::getline(in, l);) lines.push_back(l);
    return lines;
  }

 private:
  fs::path dir_;
};

// A metrics.csv of the version before tokens_per_s (17 columns, rel_l2 last): train rows at
// steps 1-4, an eval row at step 2, one at step 4.
const std::string before_tokens =
    "kind,step,epoch,loss,lr,grad_norm,samples_per_s,accuracy,wall_s,t_data,t_forward,t_backward,"
    "t_allreduce,t_optimizer,t_tensor,t_pipeline,rel_l2\n"
    "train,1,0,2.5,0.001,1.25,0.31,,30.125,1,2,3,4,5,0,0,\n"
    "train,2,0,2.25,0.001,1.125,0.32,,60.25,1,2,3,4,5,0,0,\n"
    "eval,2,0,2.20000001,,,,0.5,75.5,,,,,,,,\n"
    "train,3,0,2,0.001,1,0.33,,105.375,1,2,3,4,5,0,0,\n"
    "train,4,0,1.75,0.001,0.875,0.34,,135.5,1,2,3,4,5,0,0,\n"
    "eval,4,0,1.7,,,,0.6,150,,,,,,,,\n";

TEST_F(MetricsResume, AFileWithoutTokensPerSecondKeepsItsRowsUnderTodaysHeader) {
  write_csv(before_tokens);
  {
    RunOutput out(true, dir(), 3);
    const std::vector<std::string> lines = csv_lines();
    ASSERT_EQ(lines.size(), 5u);
    EXPECT_EQ(lines[0], header);
    // The rows up to step 3, each cell as it was, and an empty tokens_per_s.
    EXPECT_EQ(lines[1], "train,1,0,2.5,0.001,1.25,0.31,,30.125,1,2,3,4,5,0,0,,");
    EXPECT_EQ(lines[2], "train,2,0,2.25,0.001,1.125,0.32,,60.25,1,2,3,4,5,0,0,,");
    EXPECT_EQ(lines[3], "eval,2,0,2.20000001,,,,0.5,75.5,,,,,,,,,");
    EXPECT_EQ(lines[4], "train,3,0,2,0.001,1,0.33,,105.375,1,2,3,4,5,0,0,,");
    // The run goes on: a GPT's row carries tokens/s beside samples/s.
    MetricsRow row;
    row.kind = "train";
    row.step = 4;
    row.loss = 1.5;
    row.samples_per_s = 0.35;
    row.tokens_per_s = 0.35 * 1024;
    row.wall_s = 200;
    out.metrics(row);
  }
  const std::vector<std::string> lines = csv_lines();
  ASSERT_EQ(lines.size(), 6u);
  EXPECT_EQ(lines[5], "train,4,0,1.5,,,0.35,,200.000,,,,,,,,,358.4");

  // metrics.h5: the kept rows and the new one; tokens_per_s NaN where the file had none.
  EXPECT_EQ(io::read_metrics_column(h5(), "train", "step"), (std::vector<double>{1, 2, 3, 4}));
  EXPECT_EQ(io::read_metrics_column(h5(), "train", "samples_per_s"),
            (std::vector<double>{0.31, 0.32, 0.33, 0.35}));
  const auto tokens = io::read_metrics_column(h5(), "train", "tokens_per_s");
  ASSERT_EQ(tokens.size(), 4u);
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(std::isnan(tokens[i])) << i;
  EXPECT_DOUBLE_EQ(tokens[3], 358.4);
  EXPECT_EQ(io::read_metrics_column(h5(), "eval", "step"), (std::vector<double>{2}));
  EXPECT_THROW(io::read_metrics_column(h5(), "eval", "tokens_per_s"), InputError);
}

TEST_F(MetricsResume, AnOlderFileWithoutRelL2EitherKeepsItsRows) {
  write_csv(
      "kind,step,epoch,loss,lr,grad_norm,samples_per_s,accuracy,wall_s,t_data,t_forward,t_backward,"
      "t_allreduce,t_optimizer,t_tensor,t_pipeline\n"
      "train,5,1,0.5,0.01,2,1000,,1.5,0.001,0.002,0.003,0.004,0.005,0,0\n"
      "eval,5,1,0.45,,,,0.875,2,,,,,,,\n"
      "train,10,1,0.25,0.01,1,1100,,3,0.001,0.002,0.003,0.004,0.005,0,0\n");
  { RunOutput out(true, dir(), 5); }
  const std::vector<std::string> lines = csv_lines();
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[0], header);
  EXPECT_EQ(lines[1], "train,5,1,0.5,0.01,2,1000,,1.5,0.001,0.002,0.003,0.004,0.005,0,0,,");
  EXPECT_EQ(lines[2], "eval,5,1,0.45,,,,0.875,2,,,,,,,,,");
  EXPECT_EQ(io::read_metrics_column(h5(), "eval", "accuracy"), (std::vector<double>{0.875}));
}

TEST_F(MetricsResume, CellsMoveByColumnName) {
  // Columns in another order (a file edited by hand): each cell lands in its column.
  write_csv("step,kind,loss,epoch,tokens_per_s,samples_per_s\n3,train,0.5,0,512,0.5\n");
  { RunOutput out(true, dir(), 3); }
  const std::vector<std::string> lines = csv_lines();
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(lines[1], "train,3,0,0.5,,,0.5,,,,,,,,,,,512");
  EXPECT_EQ(io::read_metrics_column(h5(), "train", "tokens_per_s"), (std::vector<double>{512}));
}

TEST_F(MetricsResume, TodaysFileIsKeptByteForByte) {
  {
    RunOutput out(true, dir(), std::nullopt);
    for (std::int64_t step = 1; step <= 4; ++step) {
      MetricsRow row;
      row.kind = "train";
      row.step = step;
      row.loss = 1.0 / 3.0 / static_cast<double>(step);
      row.lr = 0.001;
      row.samples_per_s = 0.1 * static_cast<double>(step);
      row.tokens_per_s = 102.4 * static_cast<double>(step);
      row.wall_s = 30.0 * static_cast<double>(step);
      out.metrics(row);
    }
  }
  std::vector<std::string> before = csv_lines();
  ASSERT_EQ(before.size(), 5u);
  EXPECT_EQ(before[0], header);
  { RunOutput out(true, dir(), 2); }
  before.resize(3);
  EXPECT_EQ(csv_lines(), before);
}

TEST_F(MetricsResume, AnUnknownColumnOrAMissingOneIsBadInput) {
  write_csv("kind,step,epoch,loss,perplexity\ntrain,1,0,2,7.4\n");
  try {
    RunOutput out(true, dir(), 1);
    ADD_FAILURE() << "no error";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("metrics.csv:1: column 'perplexity'"), std::string::npos) << e.what();
  }
  write_csv("kind,epoch,loss\ntrain,0,2\n");
  EXPECT_THROW(RunOutput(true, dir(), 1), InputError);
  // Nothing was written over the file.
  EXPECT_EQ(csv_lines(), (std::vector<std::string>{"kind,epoch,loss", "train,0,2"}));
}

}  // namespace
}  // namespace tessera
