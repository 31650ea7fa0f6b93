// The GPT model as a whole: every parameter's gradient against finite differences of the loss in
// double precision; recomputation equal to keeping every activation; a model cut into two
// pipeline stages (run one after the other in this process) equal to the whole; GPT-2 names.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <ostream>
#include <string>
#include <vector>

#include "blas/gemm.hpp"
#include "gradient_check.hpp"
#include "kernel_test_util.hpp"
#include "kernels/reduce.hpp"
#include "kernels/attention.hpp"
#include "kernels/precision.hpp"
#include "nn/attention.hpp"
#include "nn/gpt.hpp"
#include "nn/param_store.hpp"

namespace {

using namespace tessera;
using tessera::test::expect_gradient;
using tessera::test::Flat;
using tessera::test::to_device;
using tessera::test::to_host;

const nn::GptShape kTiny{8, 5, 8, 2, 2};  // vocab 8, context 5, width 8, 2 heads, 2 blocks

struct Batch {
  std::vector<double> tokens;       // (B, T) as floats
  std::vector<std::int32_t> labels; // (B*T)
};

Batch make_batch(int batch, const nn::GptShape& s, std::uint32_t seed) {
  Batch b;
  std::uint32_t x = seed;
  const auto next = [&] { x = x * 1664525u + 1013904223u; return int((x >> 16) % unsigned(s.vocab)); };
  for (int i = 0; i < batch * s.context; ++i) b.tokens.push_back(next());
  for (int i = 0; i < batch * s.context; ++i) b.labels.push_back(next());
  return b;
}

/// Loss (times scale) of one forward; leaves dlogits in the slot when with_grad.
template <class T>
double run_loss(nn::Gpt<T>& gpt, int slot, const Batch& b, double scale) {
  const ExecSpace exec;
  const MatrixU<T> in = gpt.input(slot);
  auto h = Kokkos::create_mirror_view(in);
  for (std::size_t i = 0; i < b.tokens.size(); ++i) h.data()[i] = T(b.tokens[i]);
  Kokkos::deep_copy(in, h);
  gpt.forward(exec, slot);
  const Vector<std::int32_t> labels = to_device(b.labels);
  const auto r = gpt.loss(exec, slot, labels, MatrixU<const T>(), T(scale));
  return scale * r.loss;
}

// Both GELUs: the exact one and GPT-2's tanh form (model.gelu_approximate = "tanh"); and the exact
// one under a sliding window of 2 positions (of the context's 5).
struct GptCase {
  bool gelu_tanh;
  int window;
};

void PrintTo(const GptCase& c, std::ostream* os) {
  *os << (c.gelu_tanh ? "tanh" : "exact") << " GELU, window " << c.window;
}

class GptGradients : public ::testing::TestWithParam<GptCase> {};

/// Every parameter's gradient of a double model of `shape` (one forward and backward of 2
/// samples) against central finite differences of its loss. The weights are scaled up from
/// GPT-2's 0.02 so that every term matters in the differences, the norms' weights away from 1 so
/// that a gradient that ignores them is seen.
void expect_every_gradient(const nn::GptShape& shape) {
  const ExecSpace exec;
  nn::ParamStore<double> store;
  nn::Gpt<double> gpt(store, shape);
  store.allocate();
  store.initialize(exec, 5);
  for (std::size_t p = 0; p < store.infos().size(); ++p) {
    if (store.infos()[p].init == nn::InitKind::normal) tessera::kernels::scale(exec, store.value(p), 20.0);
    if (store.infos()[p].init == nn::InitKind::ones) tessera::kernels::scale(exec, store.value(p), 1.7);
  }
  const int batch = 2;
  gpt.reserve(batch);
  const int slot = gpt.acquire(batch);
  const Batch b = make_batch(batch, shape, 3);
  const double scale = 1.0 / batch;
  store.zero_grads(exec);
  run_loss(gpt, slot, b, scale);
  gpt.backward(exec, slot);
  const std::vector<double> grads = to_host(store.grads());
  const auto loss = [&] { return run_loss(gpt, slot, b, scale); };
  for (const auto& info : store.infos()) {
    SCOPED_TRACE(info.name);
    const std::vector<double> g(grads.begin() + long(info.offset), grads.begin() + long(info.offset + info.size));
    expect_gradient(info.name.c_str(), Flat(store.values().data() + info.offset, info.size), g, loss);
  }
}

TEST_P(GptGradients, MatchFiniteDifferences) {
  nn::GptShape shape = kTiny;
  shape.gelu_tanh = GetParam().gelu_tanh;
  shape.window = GetParam().window;
  expect_every_gradient(shape);
}
INSTANTIATE_TEST_SUITE_P(Gpt, GptGradients, ::testing::Values(GptCase{false, 0}, GptCase{true, 0}, GptCase{false, 2}),
                         [](const ::testing::TestParamInfo<GptCase>& p) {
                           return fmt::format("{}{}", p.param.gelu_tanh ? "TanhGelu" : "ExactGelu",
                                              p.param.window > 0 ? fmt::format("Window{}", p.param.window) : "");
                         });

// The Llama family's block (RMSNorm, RoPE, grouped-query attention, SwiGLU, no biases): every
// gradient against finite differences, in two shapes: 4 heads sharing 2 key/value heads with an
// untied head, and 2 heads sharing one with the head tied (heads 2 and 4 wide: every rotation
// pair, at positions 0-4 with thetas that turn them by whole radians).
nn::GptShape llama_shape(int heads, int kv_heads, int ffn, double theta, bool tied) {
  nn::GptShape s{8, 5, 8, heads, 2};
  s.llama = true;
  s.kv_heads = kv_heads;
  s.ffn = ffn;
  s.rope_theta = theta;
  s.norm_eps = 1e-5;
  s.tied = tied;
  return s;
}

// The first again under a sliding window of 3 positions.
class LlamaGradients : public ::testing::TestWithParam<int> {};

TEST_P(LlamaGradients, MatchFiniteDifferences) {
  nn::GptShape shape = GetParam() == 1 ? llama_shape(2, 1, 12, 3.0, true) : llama_shape(4, 2, 6, 10000.0, false);
  if (GetParam() == 2) shape.window = 3;
  expect_every_gradient(shape);
}
INSTANTIATE_TEST_SUITE_P(Llama, LlamaGradients, ::testing::Values(0, 1, 2),
                         [](const ::testing::TestParamInfo<int>& p) {
                           return p.param == 0 ? "GroupedQueryUntied"
                                  : p.param == 1 ? "OneKeyValueHeadTied"
                                                 : "GroupedQueryUntiedWindow3";
                         });

TEST(Llama, NamesAndShapesFollowTheDesign) {
  nn::ParamStore<float> store;
  nn::Gpt<float> gpt(store, llama_shape(4, 2, 6, 10000.0, false));
  std::vector<std::string> names;
  std::vector<std::vector<std::int64_t>> shapes;
  for (const auto& info : store.infos()) {
    names.push_back(info.name);
    shapes.push_back(info.logical_shape);
  }
  const std::vector<std::string> want{"wte.weight", "blocks.0.ln_1.weight", "blocks.0.attn.q.weight",
                                      "blocks.0.attn.k.weight", "blocks.0.attn.v.weight",
                                      "blocks.0.attn.proj.weight", "blocks.0.ln_2.weight",
                                      "blocks.0.mlp.gate.weight", "blocks.0.mlp.up.weight",
                                      "blocks.0.mlp.proj.weight"};
  ASSERT_EQ(names.size(), 1 + 2 * 9 + 2u);
  for (std::size_t i = 0; i < want.size(); ++i) EXPECT_EQ(names[i], want[i]);
  EXPECT_EQ(names[names.size() - 2], "ln_f.weight");
  EXPECT_EQ(names.back(), "lm_head.weight");
  EXPECT_EQ(shapes[3], (std::vector<std::int64_t>{4, 8}));  // 2 key/value heads of 2
  EXPECT_EQ(shapes[7], (std::vector<std::int64_t>{6, 8}));
  EXPECT_EQ(shapes[9], (std::vector<std::int64_t>{8, 6}));
}

TEST(Llama, RecomputeEqualsKeepingActivations) {
  const ExecSpace exec;
  nn::ParamStore<float> s1, s2;
  const nn::GptShape shape = llama_shape(4, 2, 6, 10000.0, false);
  nn::Gpt<float> keep(s1, shape);
  nn::Gpt<float>::Part part;
  part.recompute = true;
  nn::Gpt<float> recompute(s2, shape, part);
  for (auto* s : {&s1, &s2}) {
    s->allocate();
    s->initialize(exec, 9);
  }
  keep.reserve(3);
  recompute.reserve(3);
  const Batch batch = make_batch(3, shape, 11);
  for (auto* s : {&s1, &s2}) s->zero_grads(exec);
  const int ia = keep.acquire(3), ib = recompute.acquire(3);
  EXPECT_EQ(run_loss(keep, ia, batch, 1.0 / 3), run_loss(recompute, ib, batch, 1.0 / 3));
  keep.backward(exec, ia);
  recompute.backward(exec, ib);
  EXPECT_EQ(to_host(s1.grads()), to_host(s2.grads()));  // the same arithmetic, bit for bit
}

// The GEMM attention the model runs against the one-thread-per-row reference kernels: forward
// output and probabilities, and the backward's dqkv (2 samples, 3 heads of 4; double within 1e-12,
// float within 2e-6 of the largest value), at T = 6 (one GEMM per product) and T = 70 (causal
// blocks of 32, 32 and 6), causal and under sliding windows: 1 and 2 positions, 7 (not dividing
// the block), 40 (longer than a block: a block's rows reach into the block before the one before).
// The probabilities and scores buffers start as NaN: every entry the products skip is written.
struct AttentionCase {
  std::size_t seq;
  int window;
};

void PrintTo(const AttentionCase& c, std::ostream* os) { *os << "T = " << c.seq << ", window " << c.window; }

class GemmAttention : public ::testing::TestWithParam<AttentionCase> {};

template <class T>
void expect_gemm_attention_is_the_reference(std::size_t seq, int window, double tol) {
  const ExecSpace exec;
  const std::size_t B = 2, H = 3, C = 12, rows = B * seq;
  const Matrix<T> qkv = to_device(tessera::test::random_vector<T>(rows * 3 * C, 4, -1.5, 1.5), rows, 3 * C);
  const Matrix<T> dy = to_device(tessera::test::random_vector<T>(rows * C, 5, -1, 1), rows, C);
  Matrix<T> y_ref("y_ref", rows, C), y("y", rows, C), d_ref("d_ref", rows, 3 * C), d("d", rows, 3 * C);
  kernels::AttentionView<T> att_ref("att_ref", B, H, seq, seq), ds_ref("ds_ref", B, H, seq, seq),
      att("att", B, H, seq, seq), ds("ds", B, H, seq, seq);
  Kokkos::deep_copy(att, std::numeric_limits<T>::quiet_NaN());
  Kokkos::deep_copy(ds, std::numeric_limits<T>::quiet_NaN());
  kernels::attention_forward(exec, qkv, y_ref, att_ref, window);
  kernels::attention_backward(exec, qkv, att_ref, dy, d_ref, ds_ref, window);
  const auto scores = [&](const kernels::AttentionView<T>& a) {
    return nn::AttentionScores<T>(a.data(), B, H, seq, seq);
  };
  nn::attention_forward<T>(exec, Precision::fp32, qkv, y, scores(att), window);
  nn::attention_backward<T>(exec, Precision::fp32, qkv, scores(att), dy, d, scores(ds), window);
  const auto close = [tol](const std::vector<T>& a, const std::vector<T>& b, const char* what) {
    ASSERT_EQ(a.size(), b.size());
    double scale = 0.0;
    for (const T v : a) scale = std::max(scale, std::fabs(double(v)));
    for (std::size_t i = 0; i < a.size(); ++i) ASSERT_NEAR(a[i], b[i], tol * scale) << what << "[" << i << "]";
  };
  close(to_host(y_ref), to_host(y), "y");
  close(to_host(Vector<T>(att_ref.data(), att_ref.size())), to_host(Vector<T>(att.data(), att.size())), "att");
  close(to_host(d_ref), to_host(d), "dqkv");
}

TEST_P(GemmAttention, EqualsTheReferenceKernels) {
  {
    SCOPED_TRACE("double");
    expect_gemm_attention_is_the_reference<double>(GetParam().seq, GetParam().window, 1e-12);
  }
  SCOPED_TRACE("float");
  expect_gemm_attention_is_the_reference<float>(GetParam().seq, GetParam().window, 2e-6);
}

INSTANTIATE_TEST_SUITE_P(Gpt, GemmAttention,
                         ::testing::Values(AttentionCase{6, 0}, AttentionCase{70, 0}, AttentionCase{6, 1},
                                           AttentionCase{6, 2}, AttentionCase{70, 1}, AttentionCase{70, 2},
                                           AttentionCase{70, 7}, AttentionCase{70, 40}),
                         [](const ::testing::TestParamInfo<AttentionCase>& p) {
                           return p.param.window > 0 ? fmt::format("T{}Window{}", p.param.seq, p.param.window)
                                                     : fmt::format("T{}Causal", p.param.seq);
                         });

// Under bf16 operands the GPT keeps qkv as bf16 head blocks (nn::qkv_to_bf16) and runs the
// attention in bf16 (batched products, the softmax reading and writing bf16): against the
// reference kernels in double on the same bf16 values, within what bf16 storage of the scores,
// the probabilities and the outputs allows; the probabilities exactly zero above the diagonal.
// T = 70: causal blocks of 32, 32 and 6 (rows whose masked chunk reaches n).
void expect_bf16_attention_is_the_reference(int window) {
  const ExecSpace exec;
  const std::size_t B = 2, H = 3, T = 70, C = 12, rows = B * T, hd = C / H;
  std::vector<float> qkv_h = tessera::test::random_vector<float>(rows * 3 * C, 6, -1.5, 1.5);
  std::vector<float> dy_h = tessera::test::random_vector<float>(rows * C, 7, -1, 1);
  for (float& v : qkv_h) v = kernels::round_bf16(v);  // the values the bf16 path sees
  for (float& v : dy_h) v = kernels::round_bf16(v);
  const Matrix<float> qkv = to_device(qkv_h, rows, 3 * C);
  std::vector<std::uint16_t> dy16_h(dy_h.size());
  for (std::size_t i = 0; i < dy_h.size(); ++i) dy16_h[i] = kernels::to_bf16_bits(dy_h[i]);
  // The reference in double.
  std::vector<double> qkv_d(qkv_h.begin(), qkv_h.end()), dy_d(dy_h.begin(), dy_h.end());
  const Matrix<double> qkv_r = to_device(qkv_d, rows, 3 * C), dy_r = to_device(dy_d, rows, C);
  Matrix<double> y_ref("y_ref", rows, C), d_ref("d_ref", rows, 3 * C);
  kernels::AttentionView<double> att_ref("att_ref", B, H, T, T), ds_ref("ds_ref", B, H, T, T);
  kernels::attention_forward(exec, qkv_r, y_ref, att_ref, window);
  kernels::attention_backward(exec, qkv_r, att_ref, dy_r, d_ref, ds_ref, window);
  // The bf16 attention, its scores buffers NaN to begin with (every entry is written).
  Vector<std::uint16_t> qkv16("qkv16", rows * 3 * C);
  nn::qkv_to_bf16(exec, qkv, int(H), int(T), qkv16.data());
  Matrix<std::uint16_t> y16("y16", rows, C), d16("d16", rows, 3 * C);
  const Matrix<std::uint16_t> dy16 = to_device(dy16_h, rows, C);
  Kokkos::View<std::uint16_t****, Kokkos::LayoutRight, MemSpace> att16("att16", B, H, T, T), ds16("ds16", B, H, T, T);
  Kokkos::deep_copy(att16, std::uint16_t(0x7fc0));  // bf16 NaN
  Kokkos::deep_copy(ds16, std::uint16_t(0x7fc0));
  const auto view = [&](const auto& a) { return nn::AttentionScores<std::uint16_t>(a.data(), B, H, T, T); };
  nn::attention_forward_bf16(exec, qkv16.data(), y16, view(att16), window);
  nn::attention_backward_bf16(exec, qkv16.data(), view(att16), dy16, d16, view(ds16), window);
  const auto close = [](const std::vector<std::uint16_t>& got, const std::vector<double>& want, double tol,
                        const char* what) {
    ASSERT_EQ(got.size(), want.size());
    double scale = 0.0;
    for (double w : want) scale = std::max(scale, std::fabs(w));
    for (std::size_t i = 0; i < want.size(); ++i)
      ASSERT_NEAR(kernels::from_bf16_bits(got[i]), want[i], tol * scale) << what << "[" << i << "]";
  };
  close(to_host(y16), to_host(y_ref), 2e-2, "y");
  close(to_host(Vector<std::uint16_t>(att16.data(), att16.size())),
        to_host(Vector<double>(att_ref.data(), att_ref.size())), 1e-2, "att");
  close(to_host(d16), to_host(d_ref), 3e-2, "dqkv");
  const std::vector<std::uint16_t> p = to_host(Vector<std::uint16_t>(att16.data(), att16.size()));
  for (std::size_t r = 0; r < B * H * T; ++r) {
    double sum = 0.0;
    for (std::size_t j = 0; j < T; ++j) {
      if (j > r % T || (window > 0 && j + std::size_t(window) <= r % T)) {
        ASSERT_EQ(p[r * T + j], 0) << "row " << r << " key " << j;
      }
      sum += kernels::from_bf16_bits(p[r * T + j]);
    }
    ASSERT_NEAR(sum, 1.0, 2e-2) << "row " << r;
  }
  // The head blocks: q of sample 1, head 2, position 3, element 1.
  const std::vector<std::uint16_t> h16 = to_host(qkv16);
  EXPECT_EQ(h16[((1 * 3 + 0) * H + 2) * T * hd + 3 * hd + 1],
            kernels::to_bf16_bits(qkv_h[(1 * T + 3) * 3 * C + 2 * hd + 1]));
}

TEST(Gpt, Bf16AttentionAgreesWithTheReference) {
  if (!blas::bf16_operands(Precision::bf16))
    GTEST_SKIP() << "no host bf16 GEMM here: " << blas::lowp_path(Precision::bf16);
  expect_bf16_attention_is_the_reference(0);
}

// The same under sliding windows of 1, 2 and 7 positions (the softmax's chunks of 16 start before
// the window and are masked there) and 40 (a block's products reach two blocks back).
TEST(Gpt, Bf16WindowAttentionAgreesWithTheReference) {
  if (!blas::bf16_operands(Precision::bf16))
    GTEST_SKIP() << "no host bf16 GEMM here: " << blas::lowp_path(Precision::bf16);
  for (const int window : {1, 2, 7, 40}) {
    SCOPED_TRACE(window);
    expect_bf16_attention_is_the_reference(window);
  }
}

// Under bf16 operands the last stage keeps its logits and their gradient in bf16 (the loss reads
// and writes them with fp32 arithmetic): the loss, the next-token logits and a gradient agree with
// the same model in fp32 within bf16's rounding, and output() / grad_output() refuse (no fp32
// logits to hand out).
TEST(Gpt, Bf16LogitsAndLossAgreeWithFp32) {
  const ExecSpace exec;
  const int batch = 2;
  const Batch b = make_batch(batch, kTiny, 11);
  struct Run {
    double loss = 0;
    std::vector<float> next, grads;
  };
  const auto run = [&](Precision p) {
    nn::ParamStore<float> store;
    nn::Gpt<float>::Part part;
    part.precision = p;
    nn::Gpt<float> gpt(store, kTiny, part);
    store.allocate();
    store.initialize(exec, 5);
    gpt.reserve(batch);
    const int slot = gpt.acquire(batch);
    Run r;
    store.zero_grads(exec);
    r.loss = run_loss(gpt, slot, b, 1.0);
    gpt.backward(exec, slot);
    r.grads = to_host(store.grads());
    Matrix<float> next("next", batch, kTiny.vocab);
    gpt.next_token_logits(exec, slot, 3, next);
    r.next = to_host(next);
    if (p == Precision::bf16) {
      EXPECT_THROW(gpt.output(slot), std::logic_error);
      EXPECT_THROW(gpt.grad_output(slot), std::logic_error);
    }
    return r;
  };
  const Run f = run(Precision::fp32);
  if (!blas::bf16_operands(Precision::bf16))
    GTEST_SKIP() << "no host bf16 GEMM here: " << blas::lowp_path(Precision::bf16);
  const Run h = run(Precision::bf16);
  EXPECT_NEAR(h.loss, f.loss, 1e-2 * std::fabs(f.loss));
  EXPECT_NE(h.loss, f.loss);  // the rounding is real
  ASSERT_EQ(h.next.size(), f.next.size());
  for (std::size_t i = 0; i < f.next.size(); ++i) EXPECT_NEAR(h.next[i], f.next[i], 2e-2) << "logit " << i;
  double scale = 0, diff = 0;
  for (std::size_t i = 0; i < f.grads.size(); ++i) {
    scale = std::max(scale, double(std::fabs(f.grads[i])));
    diff = std::max(diff, double(std::fabs(h.grads[i] - f.grads[i])));
  }
  EXPECT_LE(diff, 5e-2 * scale);
}

// What a window means for a whole model, without a reference: through L blocks of a window of W,
// position i sees the tokens [i - L (W - 1), i] and no other. Changing token t0 changes the
// next-token logits (nn::Gpt::next_token_logits, what `tessera generate` reads) of positions
// t0 .. t0 + L (W - 1) and leaves every other position's bit for bit; for the gpt and the llama, in
// the products' precision p (fp32 here, bf16 below: each has its own call of the attention).
void expect_window_limits_what_each_position_sees(Precision p) {
  const ExecSpace exec;
  nn::GptShape gpt{8, 12, 8, 2, 2};  // vocab 8, context 12, width 8, 2 heads, 2 blocks
  gpt.window = 3;
  nn::GptShape llama = llama_shape(4, 2, 6, 10000.0, false);
  llama.context = 12;
  llama.window = 3;
  const int t0 = 3, seen = 2 * (3 - 1);  // positions t0 .. t0 + seen see token t0
  for (const nn::GptShape& shape : {gpt, llama}) {
    SCOPED_TRACE(shape.llama ? "llama" : "gpt");
    nn::ParamStore<float> store;
    nn::Gpt<float>::Part part;
    part.precision = p;
    nn::Gpt<float> model(store, shape, part);
    store.allocate();
    store.initialize(exec, 5);
    for (std::size_t i = 0; i < store.infos().size(); ++i)  // sharper attention: every token matters
      if (store.infos()[i].init == nn::InitKind::normal) tessera::kernels::scale(exec, store.value(i), 10.0f);
    model.reserve(1);
    const int slot = model.acquire(1);
    const auto logits = [&](int token) {  // every position's, the token at t0 set
      Batch b = make_batch(1, shape, 7);
      b.tokens[std::size_t(t0)] = token;
      std::vector<std::vector<float>> out;
      for (int n = 1; n <= shape.context; ++n) {
        run_loss(model, slot, b, 1.0);  // fills the slot's input
        Matrix<float> next("next", 1, std::size_t(shape.vocab));
        model.next_token_logits(exec, slot, n, next);
        out.push_back(to_host(next));
      }
      return out;
    };
    const auto a = logits(1), b = logits(6);
    for (int i = 0; i < shape.context; ++i) {
      if (i >= t0 && i <= t0 + seen) {
        EXPECT_NE(a[std::size_t(i)], b[std::size_t(i)]) << "position " << i;
      } else {
        EXPECT_EQ(a[std::size_t(i)], b[std::size_t(i)]) << "position " << i;
      }
    }
  }
}

TEST(Gpt, WindowLimitsWhatEachPositionSees) { expect_window_limits_what_each_position_sees(Precision::fp32); }

TEST(Gpt, Bf16WindowLimitsWhatEachPositionSees) {
  if (!blas::bf16_operands(Precision::bf16))
    GTEST_SKIP() << "no host bf16 GEMM here: " << blas::lowp_path(Precision::bf16);
  expect_window_limits_what_each_position_sees(Precision::bf16);
}

TEST(Gpt, NamesFollowGpt2) {
  nn::ParamStore<float> store;
  nn::Gpt<float> gpt(store, kTiny);
  std::vector<std::string> names;
  for (const auto& info : store.infos()) names.push_back(info.name);
  const std::vector<std::string> want_first{"wte.weight", "wpe.weight", "blocks.0.ln_1.weight",
                                            "blocks.0.ln_1.bias", "blocks.0.attn.qkv.weight",
                                            "blocks.0.attn.qkv.bias", "blocks.0.attn.proj.weight",
                                            "blocks.0.attn.proj.bias", "blocks.0.ln_2.weight",
                                            "blocks.0.ln_2.bias", "blocks.0.mlp.fc.weight",
                                            "blocks.0.mlp.fc.bias", "blocks.0.mlp.proj.weight",
                                            "blocks.0.mlp.proj.bias"};
  ASSERT_GE(names.size(), want_first.size());
  for (std::size_t i = 0; i < want_first.size(); ++i) EXPECT_EQ(names[i], want_first[i]);
  EXPECT_EQ(names.back(), "ln_f.bias");
  EXPECT_EQ(store.infos()[4].logical_shape, (std::vector<std::int64_t>{3, 8, 8}));
  EXPECT_EQ(store.infos()[12].logical_shape, (std::vector<std::int64_t>{8, 32}));
}

/// Losses and every gradient of `a` and `b` after the same batch; equal within tol (relative).
void expect_same_run(nn::ParamStore<float>& sa, nn::Gpt<float>& a, nn::ParamStore<float>& sb,
                     nn::Gpt<float>& b, double tol) {
  const ExecSpace exec;
  const Batch batch = make_batch(3, kTiny, 11);
  for (auto* s : {&sa, &sb}) s->zero_grads(exec);
  const int ia = a.acquire(3), ib = b.acquire(3);
  const double la = run_loss(a, ia, batch, 1.0 / 3), lb = run_loss(b, ib, batch, 1.0 / 3);
  a.backward(exec, ia);
  b.backward(exec, ib);
  EXPECT_NEAR(la, lb, tol * std::abs(la));
  const auto ga = to_host(sa.grads()), gb = to_host(sb.grads());
  ASSERT_EQ(ga.size(), gb.size());
  for (std::size_t i = 0; i < ga.size(); ++i) EXPECT_NEAR(ga[i], gb[i], tol * (1e-3 + std::abs(ga[i]))) << i;
  a.release(ia);
  b.release(ib);
}

TEST(Gpt, RecomputeEqualsKeepingActivations) {
  const ExecSpace exec;
  nn::ParamStore<float> s1, s2;
  nn::Gpt<float> keep(s1, kTiny);
  nn::Gpt<float>::Part part;
  part.recompute = true;
  nn::Gpt<float> recompute(s2, kTiny, part);
  for (auto* s : {&s1, &s2}) {
    s->allocate();
    s->initialize(exec, 9);
  }
  keep.reserve(3);
  recompute.reserve(3);
  expect_same_run(s1, keep, s2, recompute, 0.0);  // the same arithmetic, bit for bit
}

TEST(Gpt, TwoStagesEqualTheWhole) {
  const ExecSpace exec;
  nn::ParamStore<float> whole_store, s0, s1;
  nn::Gpt<float> whole(whole_store, kTiny);
  nn::Gpt<float>::Part p0, p1;
  p0.end_block = 1;
  p1.first_block = 1;
  nn::Gpt<float> first(s0, kTiny, p0), last(s1, kTiny, p1);
  for (auto* s : {&whole_store, &s0, &s1}) {
    s->allocate();
    s->initialize(exec, 4);
    s->zero_grads(exec);
  }
  EXPECT_EQ(s1.infos().back().name, "wte.weight");
  EXPECT_EQ(s1.infos().back().tie, nn::Tie::copy);
  EXPECT_EQ(s0.infos().front().tie, nn::Tie::original);
  for (auto* g : {&whole, &first, &last}) g->reserve(3);
  const Batch batch = make_batch(3, kTiny, 11);
  const int w = whole.acquire(3), a = first.acquire(3), b = last.acquire(3);
  const double lw = run_loss(whole, w, batch, 1.0 / 3);
  whole.backward(exec, w);
  // Stage 0 forward, its output into stage 1's input, stage 1 loss and backward, back again.
  {
    const MatrixU<float> in = first.input(a);
    auto h = Kokkos::create_mirror_view(in);
    for (std::size_t i = 0; i < batch.tokens.size(); ++i) h.data()[i] = float(batch.tokens[i]);
    Kokkos::deep_copy(in, h);
  }
  first.forward(exec, a);
  Kokkos::deep_copy(last.input(b), first.output(a));
  last.forward(exec, b);
  const auto r = last.loss(exec, b, to_device(batch.labels), MatrixU<const float>(), 1.0f / 3);
  last.backward(exec, b);
  Kokkos::deep_copy(first.grad_output(a), last.grad_input(b));
  first.backward(exec, a);
  EXPECT_NEAR(r.loss / 3, lw, 1e-6 * lw);
  // Every parameter's gradient: the tied embedding's is the sum of both stages' (OptimizerStep sums
  // them in a run).
  for (const auto& info : whole_store.infos()) {
    SCOPED_TRACE(info.name);
    std::vector<float> split;
    if (info.name == "wte.weight") {
      const auto g0 = to_host(s0.grad(s0.find(info.name))), g1 = to_host(s1.grad(s1.find(info.name)));
      for (std::size_t i = 0; i < g0.size(); ++i) split.push_back(g0[i] + g1[i]);
    } else {
      auto& s = info.name.rfind("blocks.1", 0) == 0 || info.name.rfind("ln_f", 0) == 0 ? s1 : s0;
      split = to_host(s.grad(s.find(info.name)));
    }
    const auto g = to_host(whole_store.grad(whole_store.find(info.name)));
    ASSERT_EQ(g.size(), split.size());
    for (std::size_t i = 0; i < g.size(); ++i) EXPECT_NEAR(g[i], split[i], 1e-5 * (1e-3 + std::abs(g[i])));
  }
}

}  // namespace
