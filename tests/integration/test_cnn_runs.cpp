// End-to-end: the CNN on Fashion-MNIST trains the same model (losses and evaluations within 1e-5
// of the 1-rank run) data-parallel, tensor-parallel on its linear layers and with ZeRO-1, and
// with its convolutions through oneDNN or im2col (run.conv); a pipeline, an even kernel or an
// unknown run.conv is a one-line deck error.
#include <gtest/gtest.h>

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

TEST(Cnn, TheLogNamesTheConvolutionPath) {
  const std::string dir = fresh_dir("cnn_conv_log");
  RunResult r = tessera(1, train_args(dir, kCnn + " --set train.steps=1 --set run.conv=im2col"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string log = read_file(dir + "/log.txt");
  EXPECT_NE(log.find("conv: fp32 -> im2col (GEMM per sample"), std::string::npos) << log;
  EXPECT_NE(log.find("; run.conv = im2col"), std::string::npos) << log;
  r = tessera(1, train_args(dir, kCnn + " --set run.conv=fft"));
  expect_input_error(r, "run.conv");
}

TEST(Cnn, PipelineAndEvenKernelsAreDeckErrors) {
  const std::string dir = fresh_dir("cnn_errors");
  RunResult r = tessera(2, train_args(dir, kCnn + " --set parallel.pipeline=2"));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("parallel.pipeline"), std::string::npos) << r.output;
  r = tessera(1, train_args(dir, kCnn + " --set model.kernel=4"));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("model.kernel"), std::string::npos) << r.output;
  r = tessera(1, train_args(dir, "--set model.kind=cnn --set model.channels=[4,4,4,4,4,4]"));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("model.channels"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace tessera::test
