// What rank 0 prints and writes besides checkpoints: the progress line (percent, rate, ETA, no
// carriage returns) and metrics.h5 (the rows of metrics.csv, column by column).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <regex>
#include <sstream>

#include "io/metrics_file.hpp"
#include "run_helpers.hpp"
#include "train/run_output.hpp"

namespace tessera::test {
namespace {

const std::string deck = std::string(TESSERA_SOURCE_DIR) + "/tests/integration/mlp_test.toml";

// One 2-rank run of the test deck with a train row every 3 steps (and the last), made once.
const std::string& run_dir() {
  static const std::string dir = [] {
    const std::string d = fresh_dir("run_output");
    const RunResult r = tessera(2, fmt::format("train {} --set data.path={} --set run.output_dir={} "
                                               "--set train.log_every=3 > {}/stdout.txt",
                                               deck, fashion_mnist(), d, d));
    EXPECT_EQ(r.exit_code, 0) << r.output;
    return d;
  }();
  return dir;
}

TEST(RunOutput, RatesHaveThreeSignificantDigitsAndNoExponent) {
  EXPECT_EQ(format_rate(15398.4), "15400");
  EXPECT_EQ(format_rate(812.49), "812");
  EXPECT_EQ(format_rate(3.14159), "3.14");
  EXPECT_EQ(format_rate(0.045649), "0.0456");
  EXPECT_EQ(format_rate(0.31), "0.310");  // a GPT-2-small step of many seconds: not "0"
  EXPECT_EQ(format_rate(999.6), "1000");
  EXPECT_EQ(format_rate(9.996), "10.0");
  EXPECT_EQ(format_rate(0.0), "0");
  EXPECT_EQ(format_rate(std::nan("")), "?");
}

TEST(RunOutput, ProgressLinesShowPercentRateAndEtaWithoutCarriageReturns) {
  const std::string out = read_file(run_dir() + "/stdout.txt");
  const std::string log = read_file(run_dir() + "/log.txt");
  EXPECT_EQ(out.find('\r'), std::string::npos);
  EXPECT_EQ(log.find('\r'), std::string::npos);
  const std::regex line(R"(step +(\d+)/30 \((\d+\.\d)%\) epoch \S+ loss \S+ lr \S+ grad_norm \S+ )"
                        R"(samples/s \d+(\.\d+)? eta (\d+s|\d+m\d\ds|\d+h\d\dm))");
  std::vector<int> steps;
  std::stringstream ss(out);
  for (std::string l; std::getline(ss, l);) {
    if (!l.starts_with("step ")) continue;
    std::smatch m;
    ASSERT_TRUE(std::regex_match(l, m, line)) << l;
    const int step = std::stoi(m[1]);
    EXPECT_EQ(m[2], fmt::format("{:.1f}", 100.0 * step / 30)) << l;
    steps.push_back(step);
  }
  EXPECT_EQ(steps, (std::vector<int>{3, 6, 9, 12, 15, 18, 21, 24, 27, 30}));
  EXPECT_NE(log.find("step 30/30 (100.0%)"), std::string::npos) << log;
}

TEST(RunOutput, MetricsH5HoldsTheRowsOfMetricsCsv) {
  const std::string h5 = run_dir() + "/metrics.h5";
  for (const char* kind : {"train", "eval"}) {
    std::vector<MetricsRow> csv;
    for (const auto& r : read_metrics(run_dir()))
      if (r.kind == kind) csv.push_back(r);
    const auto steps = io::read_metrics_column(h5, kind, "step");
    const auto losses = io::read_metrics_column(h5, kind, "loss");
    ASSERT_EQ(steps.size(), csv.size()) << kind;
    ASSERT_EQ(losses.size(), csv.size()) << kind;
    for (std::size_t i = 0; i < csv.size(); ++i) {
      EXPECT_EQ(steps[i], static_cast<double>(csv[i].step)) << kind << " row " << i;
      EXPECT_NEAR(losses[i], csv[i].loss, 1e-8 * std::abs(csv[i].loss)) << kind << " row " << i;
    }
  }
  EXPECT_EQ(io::read_metrics_column(h5, "train", "step").size(), 10u);
  const auto accuracy = io::read_metrics_column(h5, "eval", "accuracy");
  ASSERT_EQ(accuracy.size(), 3u);
  for (double a : accuracy) EXPECT_TRUE(a > 0.0 && a <= 1.0) << a;
  const auto lr = io::read_metrics_column(h5, "train", "lr");
  for (double v : lr) EXPECT_FALSE(std::isnan(v));
  // An MLP counts no tokens: tokens_per_s is empty in metrics.csv and NaN in metrics.h5.
  for (const auto& r : read_metrics(run_dir())) EXPECT_FALSE(r.tokens_per_s) << r.kind << " " << r.step;
  const auto tokens = io::read_metrics_column(h5, "train", "tokens_per_s");
  ASSERT_EQ(tokens.size(), 10u);
  for (double v : tokens) EXPECT_TRUE(std::isnan(v));
  EXPECT_THROW(io::read_metrics_column(h5, "eval", "lr"), std::exception);
}

}  // namespace
}  // namespace tessera::test
