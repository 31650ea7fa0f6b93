// The fused attention (kernels/flash_attention.hpp through nn::fused_attention_*) against the
// one-thread-per-row reference kernels of kernels/attention.hpp: the output, every row's
// log-sum-exp and the backward's dqkv, in double and in float, at each register width (head
// widths 4, 16, 24, 64, 128) and at sequence lengths that are and are not multiples of 32, causal
// and under sliding windows. In a GPU build this runs the kernels the GPT runs there; in a CPU
// build the same kernels on the host.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <vector>

#include "kernel_test_util.hpp"
#include "kernels/attention.hpp"
#include "kernels/flash_attention.hpp"
#include "core/error.hpp"
#include "nn/attention.hpp"
#include "nn/gpt.hpp"
#include "nn/param_store.hpp"

namespace {

using namespace tessera;
using tessera::test::random_vector;
using tessera::test::to_device;
using tessera::test::to_host;

struct Case {
  std::size_t batch, heads, seq, channels;
  int window = 0;  ///< sliding window (0: full causal attention)
};

/// Largest |a - b| over the largest |b|: 0 where equal.
double relative_error(const std::vector<double>& a, const std::vector<double>& b) {
  double diff = 0.0, scale = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, std::fabs(a[i] - b[i]));
    scale = std::max(scale, std::fabs(b[i]));
  }
  return diff / std::max(scale, 1e-300);
}

template <class T>
std::vector<double> as_double(const std::vector<T>& v) {
  return std::vector<double>(v.begin(), v.end());
}

/// Runs the fused attention in T and the reference in double on the same inputs; expects them
/// equal within `tol` (relative to each output's largest element).
template <class T>
void expect_fused_equals_reference(const Case& c, double tol) {
  const ExecSpace exec;
  const std::size_t rows = c.batch * c.seq, C = c.channels;
  const std::vector<double> qkv_h = random_vector<double>(rows * 3 * C, 11, -2.0, 2.0);
  const std::vector<double> dy_h = random_vector<double>(rows * C, 12, -1.0, 1.0);

  // Reference, double.
  const Matrix<double> qkv_d = to_device(qkv_h, rows, 3 * C), dy_d = to_device(dy_h, rows, C);
  Matrix<double> y_ref("y_ref", rows, C), d_ref("d_ref", rows, 3 * C);
  kernels::AttentionView<double> p("p", c.batch, c.heads, c.seq, c.seq), ds("ds", c.batch, c.heads, c.seq, c.seq);
  kernels::attention_forward(exec, qkv_d, y_ref, p, c.window);
  kernels::attention_backward(exec, qkv_d, p, dy_d, d_ref, ds, c.window);

  // Fused, T; outputs poisoned first so that an unwritten element shows.
  const Matrix<T> qkv = to_device(std::vector<T>(qkv_h.begin(), qkv_h.end()), rows, 3 * C);
  const Matrix<T> dy = to_device(std::vector<T>(dy_h.begin(), dy_h.end()), rows, C);
  Matrix<T> y("y", rows, C), d("d", rows, 3 * C);
  Kokkos::deep_copy(y, T(NAN));
  Kokkos::deep_copy(d, T(NAN));
  kernels::AttentionView<T> stats("stats", c.batch, c.heads, c.seq, 1), dstats("dstats", c.batch, c.heads, c.seq, 1);
  const nn::AttentionScores<T> st(stats.data(), c.batch, c.heads, c.seq, 1), dst(dstats.data(), c.batch, c.heads, c.seq, 1);
  nn::fused_attention_forward<T>(exec, qkv, y, st, c.window);
  nn::fused_attention_backward<T>(exec, qkv, st, dy, d, dst, c.window);

  EXPECT_LE(relative_error(as_double(to_host(y)), to_host(y_ref)), tol) << "y";
  EXPECT_LE(relative_error(as_double(to_host(d)), to_host(d_ref)), tol) << "dqkv";
  // Every row's log-sum-exp gives back the reference probabilities: P_ij = exp(S_ij - lse_i).
  const auto lse = Kokkos::create_mirror_view_and_copy(HostSpace(), stats);
  const auto prob = Kokkos::create_mirror_view_and_copy(HostSpace(), p);
  const double scale = 1.0 / std::sqrt(double(C / c.heads));
  const std::size_t hd = C / c.heads;
  double worst = 0.0;
  for (std::size_t b = 0; b < c.batch; ++b)
    for (std::size_t h = 0; h < c.heads; ++h)
      for (std::size_t i = 0; i < c.seq; ++i) {
        const std::size_t w = std::size_t(c.window), lo = w > 0 && i + 1 > w ? i + 1 - w : 0;
        const std::size_t j = lo + (i - lo) / 2;  // one key of every row, in its window
        double s = 0.0;
        for (std::size_t k = 0; k < hd; ++k)
          s += qkv_h[(b * c.seq + i) * 3 * C + h * hd + k] * qkv_h[(b * c.seq + j) * 3 * C + C + h * hd + k];
        worst = std::max(worst, std::fabs(std::exp(s * scale - double(lse(b, h, i, 0))) - prob(b, h, i, j)));
      }
  EXPECT_LE(worst, tol) << "exp(S - lse) against the reference probabilities";
}

class FusedAttention : public ::testing::TestWithParam<Case> {};

TEST_P(FusedAttention, DoubleEqualsTheReference) { expect_fused_equals_reference<double>(GetParam(), 1e-12); }

TEST_P(FusedAttention, FloatEqualsTheReference) { expect_fused_equals_reference<float>(GetParam(), 2e-5); }

// Head widths 4 (padded to 16), 16, 24 (to 32), 64 and 128; lengths 1, 7, 33, 70; windows of 1,
// 2, 7 and 40 positions (the last two under and over 32, a GPU's warp of rows).
INSTANTIATE_TEST_SUITE_P(Shapes, FusedAttention,
                         ::testing::Values(Case{2, 3, 7, 12}, Case{1, 2, 70, 32}, Case{2, 2, 33, 48},
                                           Case{1, 2, 70, 128}, Case{1, 1, 33, 128}, Case{3, 1, 1, 16},
                                           Case{2, 3, 7, 12, 2}, Case{2, 2, 33, 48, 1}, Case{1, 2, 70, 32, 7},
                                           Case{1, 2, 70, 32, 40}));

TEST(FusedAttentionShapes, AreChecked) {
  const ExecSpace exec;
  Matrix<float> qkv("qkv", 2 * 4, 3 * 8), y("y", 2 * 4, 8), wide_qkv("wide_qkv", 4, 3 * 160), wide_y("wide_y", 4, 160);
  kernels::AttentionView<float> stats("stats", 2, 2, 4, 1), full("full", 2, 2, 4, 4), one("one", 1, 1, 4, 1);
  EXPECT_NO_THROW(kernels::flash_attention_forward(exec, qkv, y, stats));
  // Probabilities-shaped statistics, or a batch that does not match qkv, are refused.
  EXPECT_THROW(kernels::flash_attention_forward(exec, qkv, y, full), std::invalid_argument);
  EXPECT_THROW(kernels::flash_attention_forward(exec, wide_qkv, wide_y, stats), std::invalid_argument);
  // A head wider than 128 is refused with the deck keys that set it.
  try {
    kernels::flash_attention_forward(exec, wide_qkv, wide_y, one);
    FAIL() << "no error";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("head width 160 (model.width / model.heads) exceeds 128"), std::string::npos)
        << e.what();
  }
}

// A deck whose heads are too wide for the fused kernels is bad input on a GPU build (exit 2 with
// the key), not an internal error at the first step; the host's GEMM attention takes any width.
TEST(FusedAttentionShapes, AGptWithHeadsWiderThan128IsAnInputErrorOnlyWhereItIsFused) {
  nn::ParamStore<float> store;
  const nn::GptShape wide{16, 4, 272, 2, 1};  // vocab 16, context 4, width 272, 2 heads of 136, 1 block
  if (!nn::fused_attention) {
    EXPECT_NO_THROW(nn::Gpt<float>(store, wide));
    return;
  }
  try {
    nn::Gpt<float> gpt(store, wide);
    FAIL() << "no InputError";
  } catch (const InputError& e) {
    EXPECT_EQ(std::string(e.what()).rfind("model.width: 272 / model.heads = 136 wide heads", 0), 0u) << e.what();
  }
}

TEST(FusedAttentionShapes, TheGptUsesItExactlyWhereTheHostCannotReadTheMemory) {
  EXPECT_EQ(nn::fused_attention, (!Kokkos::SpaceAccessibility<HostSpace, MemSpace>::accessible));
  EXPECT_EQ(nn::attention_scores_width(128), nn::fused_attention ? 1u : 128u);
}

}  // namespace
