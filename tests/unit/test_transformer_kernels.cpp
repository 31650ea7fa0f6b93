// Kernels of the GPT-style transformer: LayerNorm, causal multi-head self-attention, token and
// position embedding. Forwards against naive host references in plain loops (float and double),
// backwards against central finite differences in double precision.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "gradient_check.hpp"
#include "kernel_test_util.hpp"
#include "kernels/activation.hpp"
#include "kernels/attention.hpp"
#include "kernels/embedding.hpp"
#include "kernels/layernorm.hpp"
#include "kernels/precision.hpp"

namespace {

using namespace tessera;
using tessera::test::random_vector;
using tessera::test::to_device;
using tessera::test::to_host;
using tessera::test::tolerance;

template <class T>
class TransformerKernelTest : public ::testing::Test {};
using Scalars = ::testing::Types<float, double>;
TYPED_TEST_SUITE(TransformerKernelTest, Scalars);

using tessera::test::dot;
using tessera::test::expect_gradient;
using tessera::test::Flat;


/// Row-major host copy of a rank-4 view.
template <class View>
std::vector<typename View::non_const_value_type> to_host4(const View& d) {
  auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), d);
  std::vector<typename View::non_const_value_type> out;
  for (std::size_t a = 0; a < h.extent(0); ++a)
    for (std::size_t b = 0; b < h.extent(1); ++b)
      for (std::size_t c = 0; c < h.extent(2); ++c)
        for (std::size_t e = 0; e < h.extent(3); ++e) out.push_back(h(a, b, c, e));
  return out;
}

// Shapes of every test: B=2, T=5, C=8, heads=2 (hd=4), a byte-sized toy vocabulary of 11.
constexpr int batch = 2, seq = 5, channels = 8, heads = 2, head_dim = channels / heads;
constexpr int rows = batch * seq, vocab = 11, max_seq = 7;

// --- LayerNorm -------------------------------------------------------------------------------

/// Naive LayerNorm of one row-major (rows, C) matrix in double: y, mean, rstd.
struct LayerNormRef {
  std::vector<double> y, mean, rstd;
};
template <class T>
LayerNormRef layernorm_ref(const std::vector<T>& x, const std::vector<T>& w, const std::vector<T>& b,
                           int nrows, int cols, double eps) {
  LayerNormRef r;
  for (int i = 0; i < nrows; ++i) {
    double m = 0;
    for (int c = 0; c < cols; ++c) m += x[i * cols + c];
    m /= cols;
    double v = 0;
    for (int c = 0; c < cols; ++c) v += (x[i * cols + c] - m) * (x[i * cols + c] - m);
    v /= cols;
    const double s = 1 / std::sqrt(v + eps);
    r.mean.push_back(m);
    r.rstd.push_back(s);
    for (int c = 0; c < cols; ++c) r.y.push_back((x[i * cols + c] - m) * s * w[c] + b[c]);
  }
  return r;
}

TYPED_TEST(TransformerKernelTest, LayerNormForwardMatchesReference) {
  using T = TypeParam;
  const ExecSpace exec;
  const auto x = random_vector<T>(rows * channels, 1, -2, 3);
  const auto w = random_vector<T>(channels, 2), b = random_vector<T>(channels, 3);
  const Matrix<T> d_x = to_device(x, rows, channels);
  Matrix<T> d_y("y", rows, channels);
  Vector<T> d_mean("mean", rows), d_rstd("rstd", rows);
  kernels::layernorm_forward(exec, d_x, to_device(w), to_device(b), d_y, d_mean, d_rstd);
  const LayerNormRef ref = layernorm_ref(x, w, b, rows, channels, 1e-5);
  const auto y = to_host(d_y), mean = to_host(d_mean), rstd = to_host(d_rstd);
  for (int i = 0; i < rows * channels; ++i) EXPECT_NEAR(y[i], ref.y[i], 50 * tolerance<T>()) << i;
  for (int i = 0; i < rows; ++i) {
    EXPECT_NEAR(mean[i], ref.mean[i], 10 * tolerance<T>()) << i;
    EXPECT_NEAR(rstd[i], ref.rstd[i], 50 * tolerance<T>() * ref.rstd[i]) << i;
  }

  // Unit weight, zero bias: every row has mean 0 and variance 1 (up to eps / var).
  const Vector<T> ones = to_device(std::vector<T>(channels, T(1)));
  const Vector<T> zeros = to_device(std::vector<T>(channels, T(0)));
  kernels::layernorm_forward(exec, d_x, ones, zeros, d_y, d_mean, d_rstd);
  const auto n = to_host(d_y);
  for (int i = 0; i < rows; ++i) {
    double m = 0, v = 0;
    for (int c = 0; c < channels; ++c) m += n[i * channels + c];
    m /= channels;
    for (int c = 0; c < channels; ++c) v += (n[i * channels + c] - m) * (n[i * channels + c] - m);
    v /= channels;
    EXPECT_NEAR(m, 0.0, 50 * tolerance<T>()) << i;
    EXPECT_NEAR(v, 1.0, 1e-3) << i;
  }

  // In place: y aliases x.
  kernels::layernorm_forward(exec, d_x, to_device(w), to_device(b), d_x, d_mean, d_rstd);
  kernels::layernorm_forward(exec, to_device(x, rows, channels), to_device(w), to_device(b), d_y,
                             d_mean, d_rstd);
  EXPECT_EQ(to_host(d_x), to_host(d_y));
}

// Under bf16 the GPT keeps LayerNorm's and the GELU's outputs in bf16 buffers (bit patterns):
// the kernels write exactly the bf16 rounding of what they write into a float buffer, and the
// rest of their outputs (mean, rstd, gelu') stay as they were.
TEST(TransformerKernels, Bf16OutputsAreTheRoundedFloatOutputs) {
  const ExecSpace exec;
  const auto x = random_vector<float>(rows * channels, 11, -3, 4);
  const Vector<float> w = to_device(random_vector<float>(channels, 12)), b = to_device(random_vector<float>(channels, 13));
  const Matrix<float> d_x = to_device(x, rows, channels);
  Matrix<float> y("y", rows, channels);
  Matrix<std::uint16_t> y16("y16", rows, channels);
  Vector<float> mean("mean", rows), rstd("rstd", rows), mean16("mean16", rows), rstd16("rstd16", rows);
  kernels::layernorm_forward(exec, d_x, w, b, y, mean, rstd);
  kernels::layernorm_forward(exec, d_x, w, b, y16, mean16, rstd16);
  const auto expect_rounded = [](const std::vector<float>& f, const std::vector<std::uint16_t>& h) {
    ASSERT_EQ(f.size(), h.size());
    for (std::size_t i = 0; i < f.size(); ++i) ASSERT_EQ(h[i], kernels::to_bf16_bits(f[i])) << i;
  };
  expect_rounded(to_host(y), to_host(y16));
  EXPECT_EQ(to_host(mean), to_host(mean16));
  EXPECT_EQ(to_host(rstd), to_host(rstd16));
  // GELU of z + bias, saving gelu' in place of z.
  Matrix<float> z = to_device(x, rows, channels), z16 = to_device(x, rows, channels);
  kernels::gelu_forward_saving_derivative(exec, b, z, y, z);
  kernels::gelu_forward_saving_derivative(exec, b, z16, y16, z16);
  expect_rounded(to_host(y), to_host(y16));
  EXPECT_EQ(to_host(z), to_host(z16));
  EXPECT_NE(to_host(y16), std::vector<std::uint16_t>(rows * channels, 0));
}

TEST(TransformerGradCheck, LayerNorm) {
  const ExecSpace exec;
  Matrix<double> x = to_device(random_vector<double>(rows * channels, 4, -2, 2), rows, channels);
  Vector<double> w = to_device(random_vector<double>(channels, 5, 0.5, 1.5));
  Vector<double> b = to_device(random_vector<double>(channels, 6));
  const auto r = random_vector<double>(rows * channels, 7);  // L = sum(y * r), so dy = r
  Matrix<double> y("y", rows, channels), dx("dx", rows, channels);
  Vector<double> mean("mean", rows), rstd("rstd", rows), dw("dw", channels), db("db", channels);
  auto loss = [&] {
    kernels::layernorm_forward(exec, x, w, b, y, mean, rstd);
    return dot(to_host(y), r);
  };
  loss();
  const Matrix<double> dy = to_device(r, rows, channels);
  kernels::layernorm_backward(exec, x, w, mean, rstd, dy, dx, dw, db);
  const auto h_dx = to_host(dx), h_dw = to_host(dw), h_db = to_host(db);
  expect_gradient("layernorm dx", flat(x), h_dx, loss);
  expect_gradient("layernorm dweight", w, h_dw, loss);
  expect_gradient("layernorm dbias", b, h_db, loss);

  // A second backward doubles dweight and dbias and overwrites dx; dx may alias dy.
  loss();
  kernels::layernorm_backward(exec, x, w, mean, rstd, dy, dy, dw, db);
  EXPECT_EQ(to_host(dy), h_dx);
  const auto dw2 = to_host(dw), db2 = to_host(db);
  for (int c = 0; c < channels; ++c) {
    EXPECT_DOUBLE_EQ(dw2[c], 2 * h_dw[c]);
    EXPECT_DOUBLE_EQ(db2[c], 2 * h_db[c]);
  }
  // With a residual stream: dx = the input gradient + residual, in place of the residual too.
  const auto res = random_vector<double>(rows * channels, 8);
  Matrix<double> d_res = to_device(res, rows, channels);
  kernels::layernorm_backward(exec, x, w, mean, rstd, to_device(r, rows, channels), d_res, dw, db, d_res);
  const auto h_res = to_host(d_res);
  for (std::size_t i = 0; i < h_res.size(); ++i) EXPECT_NEAR(h_res[i], h_dx[i] + res[i], 1e-14) << i;
}

// --- Attention -------------------------------------------------------------------------------

/// Naive causal attention in double: out (B*T, C) and P (B, heads, T, T); with a window W > 0,
/// query i sees the keys i - W < j <= i only.
template <class T>
void attention_ref(const std::vector<T>& qkv, std::vector<double>& out, std::vector<double>& att, int window = 0) {
  const int c3 = 3 * channels;
  out.assign(rows * channels, 0.0);
  att.assign(batch * heads * seq * seq, 0.0);
  for (int b = 0; b < batch; ++b)
    for (int h = 0; h < heads; ++h)
      for (int i = 0; i < seq; ++i) {
        std::vector<double> s(seq, 0.0);
        double mx = -1e300;
        const int lo = window > 0 ? std::max(0, i - window + 1) : 0;
        for (int j = lo; j <= i; ++j) {
          for (int d = 0; d < head_dim; ++d)
            s[j] += double(qkv[(b * seq + i) * c3 + h * head_dim + d]) *
                    double(qkv[(b * seq + j) * c3 + channels + h * head_dim + d]);
          s[j] /= std::sqrt(double(head_dim));
          mx = std::max(mx, s[j]);
        }
        double sum = 0;
        for (int j = lo; j <= i; ++j) sum += std::exp(s[j] - mx);
        for (int j = lo; j <= i; ++j) {
          const double p = std::exp(s[j] - mx) / sum;
          att[((b * heads + h) * seq + i) * seq + j] = p;
          for (int d = 0; d < head_dim; ++d)
            out[(b * seq + i) * channels + h * head_dim + d] +=
                p * double(qkv[(b * seq + j) * c3 + 2 * channels + h * head_dim + d]);
        }
      }
}

TEST(TransformerKernels, AttentionIsCausal) {
  const ExecSpace exec;
  const auto qkv = random_vector<double>(rows * 3 * channels, 9, -2, 2);
  Matrix<double> out("out", rows, channels);
  kernels::AttentionView<double> att("att", batch, heads, seq, seq);
  kernels::attention_forward(exec, to_device(qkv, rows, 3 * channels), out, att);
  const auto before = to_host(out);
  for (int i0 = 0; i0 < seq - 1; ++i0) {
    // Change q, k and v of every position after i0 in batch 0.
    auto changed = qkv;
    const auto noise = random_vector<double>(rows * 3 * channels, 100 + unsigned(i0), -2, 2);
    for (int t = i0 + 1; t < seq; ++t)
      for (int c = 0; c < 3 * channels; ++c) changed[t * 3 * channels + c] = noise[t * 3 * channels + c];
    kernels::attention_forward(exec, to_device(changed, rows, 3 * channels), out, att);
    const auto after = to_host(out);
    for (int t = 0; t < seq; ++t)
      for (int c = 0; c < channels; ++c) {
        const std::size_t k = std::size_t(t * channels + c);
        if (t <= i0) {
          EXPECT_EQ(after[k], before[k]) << "i0 " << i0 << " t " << t << " c " << c;
        } else {
          EXPECT_NE(after[k], before[k]) << "i0 " << i0 << " t " << t << " c " << c;
        }
      }
    // Batch 1 is untouched.
    for (std::size_t k = seq * channels; k < before.size(); ++k) EXPECT_EQ(after[k], before[k]) << k;
  }
}

// Causal attention (window 0) and a sliding window of W positions (1, 2, 3, the whole sequence of
// 5, more than it): the outputs and the probabilities as the naive loops give them, the
// probabilities exactly 0 above the diagonal and outside i - W < j <= i, every row summing to 1.
TYPED_TEST(TransformerKernelTest, AttentionWindowForwardMatchesReference) {
  using T = TypeParam;
  const ExecSpace exec;
  const auto qkv = random_vector<T>(rows * 3 * channels, 8, -2, 2);
  for (const int window : {0, 1, 2, 3, seq, seq + 4}) {
    SCOPED_TRACE(window);
    Matrix<T> d_out("out", rows, channels);
    kernels::AttentionView<T> d_att("att", batch, heads, seq, seq);
    Kokkos::deep_copy(d_att, T(7));  // every entry overwritten
    kernels::attention_forward(exec, to_device(qkv, rows, 3 * channels), d_out, d_att, window);
    std::vector<double> out, att;
    attention_ref(qkv, out, att, window);
    const auto h_out = to_host(d_out);
    const auto h_att = to_host4(d_att);
    for (std::size_t i = 0; i < out.size(); ++i) EXPECT_NEAR(h_out[i], out[i], 20 * tolerance<T>()) << i;
    for (std::size_t i = 0; i < att.size(); ++i) EXPECT_NEAR(h_att[i], att[i], 20 * tolerance<T>()) << i;
    for (int r = 0; r < batch * heads * seq; ++r) {
      const int i = r % seq;
      double sum = 0;
      for (int j = 0; j < seq; ++j) {
        sum += h_att[r * seq + j];
        if (j > i || (window > 0 && j <= i - window)) {
          EXPECT_EQ(h_att[r * seq + j], T(0)) << r << "," << j;
        }
      }
      EXPECT_NEAR(sum, 1.0, 10 * tolerance<T>()) << r;
    }
  }
}

// What a window means, without a reference: changing q, k and v of position t0 changes the
// outputs of exactly the positions whose window holds t0 (t0 <= i < t0 + W), bit for bit nothing
// else.
TEST(TransformerKernels, AttentionWindowSeesItsLastWPositionsOnly) {
  const ExecSpace exec;
  const auto qkv = random_vector<double>(rows * 3 * channels, 9, -2, 2);
  for (const int window : {1, 2, 3}) {
    Matrix<double> out("out", rows, channels);
    kernels::AttentionView<double> att("att", batch, heads, seq, seq);
    kernels::attention_forward(exec, to_device(qkv, rows, 3 * channels), out, att, window);
    const auto before = to_host(out);
    for (int t0 = 0; t0 < seq; ++t0) {
      auto changed = qkv;
      const auto noise = random_vector<double>(3 * channels, 200 + unsigned(t0), -2, 2);
      for (int c = 0; c < 3 * channels; ++c) changed[t0 * 3 * channels + c] = noise[std::size_t(c)];
      kernels::attention_forward(exec, to_device(changed, rows, 3 * channels), out, att, window);
      const auto after = to_host(out);
      for (int t = 0; t < seq; ++t)
        for (int c = 0; c < channels; ++c) {
          const std::size_t k = std::size_t(t * channels + c);
          if (t >= t0 && t < t0 + window) {
            EXPECT_NE(after[k], before[k]) << "window " << window << " t0 " << t0 << " t " << t << " c " << c;
          } else {
            EXPECT_EQ(after[k], before[k]) << "window " << window << " t0 " << t0 << " t " << t << " c " << c;
          }
        }
      for (std::size_t k = seq * channels; k < before.size(); ++k) EXPECT_EQ(after[k], before[k]) << k;
    }
  }
}

TEST(TransformerKernels, AttentionRejectsBadShapes) {
  const ExecSpace exec;
  Matrix<double> qkv("qkv", rows, 3 * channels), out("out", rows, channels);
  kernels::AttentionView<double> att3("att", batch, 3, seq, seq);  // 8 channels, 3 heads
  EXPECT_THROW(kernels::attention_forward(exec, qkv, out, att3), std::invalid_argument);
  Matrix<double> qkv_short("qkv", rows, 2 * channels);
  kernels::AttentionView<double> att("att", batch, heads, seq, seq);
  EXPECT_THROW(kernels::attention_forward(exec, qkv_short, out, att), std::invalid_argument);
}

TEST(TransformerGradCheck, Attention) {
  const ExecSpace exec;
  Matrix<double> qkv = to_device(random_vector<double>(rows * 3 * channels, 10, -1.5, 1.5), rows,
                                 3 * channels);
  const auto r = random_vector<double>(rows * channels, 11);  // L = sum(out * r), so dout = r
  Matrix<double> out("out", rows, channels), dqkv("dqkv", rows, 3 * channels);
  kernels::AttentionView<double> att("att", batch, heads, seq, seq), ds("ds", batch, heads, seq, seq);
  auto loss = [&] {
    kernels::attention_forward(exec, qkv, out, att);
    return dot(to_host(out), r);
  };
  loss();
  Kokkos::deep_copy(dqkv, 7.0);  // overwritten, not accumulated
  kernels::attention_backward(exec, qkv, att, to_device(r, rows, channels), dqkv, ds);
  expect_gradient("attention dqkv", flat(qkv), to_host(dqkv), loss);
}

// The same under sliding windows of 1 and 3 positions.
TEST(TransformerGradCheck, AttentionWithWindow) {
  const ExecSpace exec;
  for (const int window : {1, 3}) {
    SCOPED_TRACE(window);
    Matrix<double> qkv = to_device(random_vector<double>(rows * 3 * channels, 12, -1.5, 1.5), rows, 3 * channels);
    const auto r = random_vector<double>(rows * channels, 13);
    Matrix<double> out("out", rows, channels), dqkv("dqkv", rows, 3 * channels);
    kernels::AttentionView<double> att("att", batch, heads, seq, seq), ds("ds", batch, heads, seq, seq);
    auto loss = [&] {
      kernels::attention_forward(exec, qkv, out, att, window);
      return dot(to_host(out), r);
    };
    loss();
    Kokkos::deep_copy(dqkv, 7.0);
    Kokkos::deep_copy(ds, 7.0);  // every entry of dS overwritten, those outside the window with 0
    kernels::attention_backward(exec, qkv, att, to_device(r, rows, channels), dqkv, ds, window);
    expect_gradient("attention dqkv", flat(qkv), to_host(dqkv), loss);
  }
}

// --- Embedding -------------------------------------------------------------------------------

/// Tokens with repeats and an unused vocabulary row (vocab - 1).
std::vector<std::int32_t> test_tokens() {
  return {3, 0, 3, 9, 1, /**/ 9, 9, 2, 0, 5};
}

TYPED_TEST(TransformerKernelTest, EmbeddingMatchesReference) {
  using T = TypeParam;
  const ExecSpace exec;
  const auto tokens = test_tokens();
  const auto wte = random_vector<T>(vocab * channels, 12), wpe = random_vector<T>(max_seq * channels, 13);
  const auto dx = random_vector<T>(rows * channels, 14);
  const Matrix<std::int32_t> d_tokens = to_device(tokens, batch, seq);
  Matrix<T> d_x("x", rows, channels);
  kernels::embedding_forward(exec, d_tokens, to_device(wte, vocab, channels),
                             to_device(wpe, max_seq, channels), d_x);
  const auto x = to_host(d_x);
  for (int b = 0; b < batch; ++b)
    for (int t = 0; t < seq; ++t)
      for (int c = 0; c < channels; ++c)
        EXPECT_EQ(x[(b * seq + t) * channels + c],
                  T(wte[tokens[b * seq + t] * channels + c] + wpe[t * channels + c]));

  // Backward accumulates onto what is there.
  const auto wte0 = random_vector<T>(vocab * channels, 15), wpe0 = random_vector<T>(max_seq * channels, 16);
  Matrix<T> d_dwte = to_device(wte0, vocab, channels), d_dwpe = to_device(wpe0, max_seq, channels);
  kernels::embedding_backward(exec, d_tokens, to_device(dx, rows, channels), d_dwte, d_dwpe);
  std::vector<double> dwte(wte0.begin(), wte0.end()), dwpe(wpe0.begin(), wpe0.end());
  for (int b = 0; b < batch; ++b)
    for (int t = 0; t < seq; ++t)
      for (int c = 0; c < channels; ++c) {
        dwte[tokens[b * seq + t] * channels + c] += dx[(b * seq + t) * channels + c];
        dwpe[t * channels + c] += dx[(b * seq + t) * channels + c];
      }
  const auto h_dwte = to_host(d_dwte), h_dwpe = to_host(d_dwpe);
  for (int i = 0; i < vocab * channels; ++i) EXPECT_NEAR(h_dwte[i], dwte[i], 10 * tolerance<T>()) << i;
  for (int i = 0; i < max_seq * channels; ++i) EXPECT_NEAR(h_dwpe[i], dwpe[i], 10 * tolerance<T>()) << i;
  // Unused vocabulary rows and positions >= T are untouched.
  for (int c = 0; c < channels; ++c) {
    EXPECT_EQ(h_dwte[(vocab - 1) * channels + c], wte0[(vocab - 1) * channels + c]);
    EXPECT_EQ(h_dwpe[(max_seq - 1) * channels + c], wpe0[(max_seq - 1) * channels + c]);
  }
}

TEST(TransformerGradCheck, Embedding) {
  const ExecSpace exec;
  const Matrix<std::int32_t> tokens = to_device(test_tokens(), batch, seq);
  Matrix<double> wte = to_device(random_vector<double>(vocab * channels, 17), vocab, channels);
  Matrix<double> wpe = to_device(random_vector<double>(max_seq * channels, 18), max_seq, channels);
  const auto r = random_vector<double>(rows * channels, 19);  // L = sum(x * r), so dx = r
  Matrix<double> x("x", rows, channels), dwte("dwte", vocab, channels), dwpe("dwpe", max_seq, channels);
  auto loss = [&] {
    kernels::embedding_forward(exec, tokens, wte, wpe, x);
    const auto h = to_host(x);
    return dot(h, r);
  };
  kernels::embedding_backward(exec, tokens, to_device(r, rows, channels), dwte, dwpe);
  expect_gradient("embedding dwte", flat(wte), to_host(dwte), loss);
  expect_gradient("embedding dwpe", flat(wpe), to_host(dwpe), loss);
}

// --- A whole block's worth, chained: LayerNorm -> attention, in double ------------------------

TEST(TransformerGradCheck, LayerNormThenAttentionOnFusedInput) {
  // LayerNorm over (B*T, 3C) rows feeding attention as qkv: checks the two backwards compose.
  const ExecSpace exec;
  const int c3 = 3 * channels;
  Matrix<double> x = to_device(random_vector<double>(rows * c3, 20, -2, 2), rows, c3);
  Vector<double> w = to_device(random_vector<double>(c3, 21, 0.5, 1.5));
  Vector<double> b = to_device(random_vector<double>(c3, 22));
  const auto r = random_vector<double>(rows * channels, 23);
  Matrix<double> y("y", rows, c3), out("out", rows, channels), dy("dy", rows, c3), dx("dx", rows, c3);
  Vector<double> mean("mean", rows), rstd("rstd", rows), dw("dw", c3), db("db", c3);
  kernels::AttentionView<double> att("att", batch, heads, seq, seq), ds("ds", batch, heads, seq, seq);
  auto loss = [&] {
    kernels::layernorm_forward(exec, x, w, b, y, mean, rstd);
    kernels::attention_forward(exec, y, out, att);
    return dot(to_host(out), r);
  };
  loss();
  kernels::attention_backward(exec, y, att, to_device(r, rows, channels), dy, ds);
  kernels::layernorm_backward(exec, x, w, mean, rstd, dy, dx, dw, db);
  expect_gradient("ln+attention dx", flat(x), to_host(dx), loss);
  expect_gradient("ln+attention dweight", w, to_host(dw), loss);
}

// --- Float backwards: the same gradients as in double, to float accuracy ---------------------

/// Every backward run in T on data rounded to float; returns dx, dweight, dbias of LayerNorm,
/// dqkv of attention, dwte and dwpe of the embedding, concatenated.
template <class T>
std::vector<double> all_backwards() {
  const ExecSpace exec;
  auto as_t = [](const std::vector<float>& v) { return std::vector<T>(v.begin(), v.end()); };
  const auto x = as_t(random_vector<float>(rows * channels, 30, -2, 2));
  const auto w = as_t(random_vector<float>(channels, 31, 0.5, 1.5));
  const auto b = as_t(random_vector<float>(channels, 32));
  const auto dy = as_t(random_vector<float>(rows * channels, 33));
  const auto qkv = as_t(random_vector<float>(rows * 3 * channels, 34, -1.5, 1.5));
  std::vector<double> all;
  auto append = [&all](const std::vector<T>& v) { all.insert(all.end(), v.begin(), v.end()); };

  // LayerNorm.
  const Matrix<T> d_x = to_device(x, rows, channels), d_dy = to_device(dy, rows, channels);
  const Vector<T> d_w = to_device(w), d_b = to_device(b);
  Matrix<T> y("y", rows, channels), dx("dx", rows, channels);
  Vector<T> mean("mean", rows), rstd("rstd", rows), dw("dw", channels), db("db", channels);
  kernels::layernorm_forward(exec, d_x, d_w, d_b, y, mean, rstd);
  kernels::layernorm_backward(exec, d_x, d_w, mean, rstd, d_dy, dx, dw, db);
  append(to_host(dx));
  append(to_host(dw));
  append(to_host(db));

  // Attention.
  const Matrix<T> d_qkv = to_device(qkv, rows, 3 * channels);
  Matrix<T> out("out", rows, channels), dqkv("dqkv", rows, 3 * channels);
  kernels::AttentionView<T> att("att", batch, heads, seq, seq), ds("ds", batch, heads, seq, seq);
  kernels::attention_forward(exec, d_qkv, out, att);
  kernels::attention_backward(exec, d_qkv, att, d_dy, dqkv, ds);
  append(to_host(dqkv));

  // Embedding.
  Matrix<T> dwte("dwte", vocab, channels), dwpe("dwpe", max_seq, channels);
  kernels::embedding_backward(exec, to_device(test_tokens(), batch, seq), d_dy, dwte, dwpe);
  append(to_host(dwte));
  append(to_host(dwpe));
  return all;
}

TEST(TransformerKernels, FloatBackwardsMatchDouble) {
  const auto f = all_backwards<float>(), d = all_backwards<double>();
  ASSERT_EQ(f.size(), d.size());
  for (std::size_t i = 0; i < f.size(); ++i) EXPECT_NEAR(f[i], d[i], 1e-4 * (1 + std::abs(d[i]))) << i;
}

}  // namespace
