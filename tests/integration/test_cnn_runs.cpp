// End-to-end: the CNN on Fashion-MNIST trains the same model (losses and evaluations within 1e-5
// of the 1-rank run) data-parallel, tensor-parallel on its linear layers and with ZeRO-1, and
// with its convolutions through oneDNN or im2col (run.conv); a pipeline, an even kernel or an
// unknown run.conv is a one-line deck error.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include "run_helpers.hpp"

namespace tessera::test {
namespace {

const std::string kCnn = "--set model.kind=cnn --set model.channels=[4,8] --set model.hidden=[32]";

TEST(Cnn, DataTensorAndZeroLayoutsTrainTheSameModel) {
  expect_layout_invariant("cnn", kCnn,
                          {{2, "--set parallel.data=2"},
                           {2, "--set parallel.tensor=2"},
                           {2, "--set parallel.data=2 --set parallel.zero=1"}});
}

TEST(Cnn, OnednnAndIm2colConvolutionsTrainTheSameModel) {
  expect_layout_invariant("cnn_conv", kCnn + " --set run.conv=im2col",
                          {{1, "--set run.conv=onednn"}, {2, "--set run.conv=onednn --set parallel.data=2"}});
}

// bf16 on oneDNN's bf16 convolutions (run.conv = auto picks them where the CPU has bf16
// instructions) tracks the fp32 curve: 30 steps within 1e-2 relative (measured below 1e-3), on 1
// rank and data-parallel on 2; the log names the path.
TEST(Cnn, Bf16ConvolutionsTrackFp32) {
  const std::string ref = fresh_dir("cnn_bf16_ref");
  RunResult r = tessera(1, train_args(ref, kCnn + " --set run.conv=onednn"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (int ranks : {1, 2}) {
    const std::string dir = fresh_dir("cnn_bf16_np" + std::to_string(ranks));
    r = tessera(ranks, train_args(dir, kCnn + " --set train.precision=bf16" +
                                           (ranks == 2 ? std::string(" --set parallel.data=2") : std::string())));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const std::string log = read_file(dir + "/log.txt");
    if (log.find("conv: bf16 -> onednn") == std::string::npos)
      GTEST_SKIP() << "no bf16 convolutions through oneDNN here: " << log.substr(log.find("conv: "), 160);
    const double diff = max_relative_difference(train_losses(ref), train_losses(dir));
    std::printf("cnn bf16 on %d rank(s): largest relative loss difference from fp32 %.3g\n", ranks, diff);
    EXPECT_LE(diff, 1e-2);
    EXPECT_GT(diff, 0.0);  // the rounding is real
  }
}

TEST(Cnn, TheLogNamesTheConvolutionPath) {
  const std::string dir = fresh_dir("cnn_conv_log");
  RunResult r = tessera(1, train_args(dir, kCnn + " --set train.steps=1 --set run.conv=im2col"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string log = read_file(dir + "/log.txt");
  EXPECT_NE(log.find("conv: fp32 -> im2col (GEMM per sample"), std::string::npos) << log;
  EXPECT_NE(log.find("; run.conv = im2col"), std::string::npos) << log;
  r = tessera_alone(train_args(dir, kCnn + " --set run.conv=fft"));
  expect_input_error(r, "run.conv");
}

TEST(Cnn, PipelineAndEvenKernelsAreDeckErrors) {
  const std::string dir = fresh_dir("cnn_errors");
  RunResult r = tessera(2, train_args(dir, kCnn + " --set parallel.pipeline=2"));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("parallel.pipeline"), std::string::npos) << r.output;
  r = tessera_alone(train_args(dir, kCnn + " --set model.kernel=4"));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("model.kernel"), std::string::npos) << r.output;
  r = tessera_alone(train_args(dir, "--set model.kind=cnn --set model.channels=[4,4,4,4,4,4]"));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("model.channels"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace tessera::test
