// End-to-end: the CNN on Fashion-MNIST trains the same model (losses and evaluations within 1e-5
// of the 1-rank run) data-parallel, tensor-parallel on its linear layers and with ZeRO-1; a
// pipeline or an even kernel is a one-line deck error.
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
