// Every kernel against a naive host reference on random data, in float and double.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "kernel_test_util.hpp"
#include "kernels/activation.hpp"
#include "kernels/bias.hpp"
#include "kernels/convert.hpp"
#include "kernels/mse.hpp"
#include "kernels/optimizer.hpp"
#include "kernels/reduce.hpp"
#include "kernels/softmax_xent.hpp"

namespace {

using namespace tessera;
using tessera::test::random_vector;
using tessera::test::to_device;
using tessera::test::to_host;
using tessera::test::tolerance;

template <class T>
class KernelTest : public ::testing::Test {};
using Scalars = ::testing::Types<float, double>;
TYPED_TEST_SUITE(KernelTest, Scalars);

// --- Activations -----------------------------------------------------------------------------

double gelu_ref(double z) { return 0.5 * z * (1.0 + std::erf(z / std::sqrt(2.0))); }
double gelu_grad_ref(double z) {
  return 0.5 * (1.0 + std::erf(z / std::sqrt(2.0))) + z * std::exp(-0.5 * z * z) / std::sqrt(2.0 * M_PI);
}

TYPED_TEST(KernelTest, ReluForwardBackward) {
  using T = TypeParam;
  const std::size_t n = 1001;
  const auto z = random_vector<T>(n, 1, -3, 3), dy = random_vector<T>(n, 2);
  auto d_z = to_device(z), d_dy = to_device(dy);
  Vector<T> d_y("y", n), d_dz("dz", n);
  const ExecSpace exec;
  kernels::relu_forward(exec, d_z, d_y);
  kernels::relu_backward(exec, d_z, d_dy, d_dz);
  const auto y = to_host(d_y), dz = to_host(d_dz);
  for (std::size_t i = 0; i < n; ++i) {
    EXPECT_EQ(y[i], z[i] > 0 ? z[i] : T(0)) << i;
    EXPECT_EQ(dz[i], z[i] > 0 ? dy[i] : T(0)) << i;
  }
  // In place: dz aliases dy.
  kernels::relu_backward(exec, d_z, d_dy, d_dy);
  EXPECT_EQ(to_host(d_dy), dz);
}

TYPED_TEST(KernelTest, GeluForwardBackwardMatchExactErfForm) {
  using T = TypeParam;
  const std::size_t n = 1001;
  const auto z = random_vector<T>(n, 3, -6, 6), dy = random_vector<T>(n, 4);
  auto d_z = to_device(z), d_dy = to_device(dy);
  Vector<T> d_y("y", n), d_dz("dz", n);
  const ExecSpace exec;
  kernels::gelu_forward(exec, d_z, d_y);
  kernels::gelu_backward(exec, d_z, d_dy, d_dz);
  const auto y = to_host(d_y), dz = to_host(d_dz);
  for (std::size_t i = 0; i < n; ++i) {
    EXPECT_NEAR(y[i], gelu_ref(z[i]), 6 * tolerance<T>() * (1 + std::abs(z[i]))) << z[i];
    EXPECT_NEAR(dz[i], dy[i] * gelu_grad_ref(z[i]), 6 * tolerance<T>()) << z[i];
  }
  // The forward that keeps gelu' (in place of z, here z - b plus the bias b) and the
  // one-product backward give the same values as the pair above; the backward's column sums
  // accumulate onto db.
  const std::size_t rows = 77, cols = 13;  // rows * cols == n
  const auto b = random_vector<T>(cols, 5), db0 = random_vector<T>(cols, 6);
  std::vector<T> z_minus_b(n);
  for (std::size_t i = 0; i < n; ++i) z_minus_b[i] = z[i] - b[i % cols];
  auto d_zd = to_device(z_minus_b, rows, cols);
  auto d_b = to_device(b), d_db = to_device(db0);
  Matrix<T> d_y2("y2", rows, cols), d_dz2("dz2", rows, cols);
  kernels::gelu_forward_saving_derivative(exec, d_b, d_zd, d_y2, d_zd);
  kernels::gelu_backward_saved(exec, d_zd, to_device(dy, rows, cols), d_dz2, d_db);
  const auto y2 = to_host(d_y2), dz2 = to_host(d_dz2), db = to_host(d_db);
  for (std::size_t i = 0; i < n; ++i) {
    EXPECT_NEAR(y2[i], y[i], 2 * tolerance<T>() * (1 + std::abs(z[i]))) << z[i];
    EXPECT_NEAR(dz2[i], dz[i], 2 * tolerance<T>() * (1 + std::abs(dy[i]))) << z[i];
  }
  for (std::size_t j = 0; j < cols; ++j) {
    double sum = db0[j];
    for (std::size_t i = 0; i < rows; ++i) sum += double(dz2[i * cols + j]);
    EXPECT_NEAR(db[j], sum, 20 * tolerance<T>() * (1 + std::abs(sum))) << j;
  }
  // Known values (PyTorch: F.gelu(torch.tensor([1.0, -2.0], dtype=torch.float64))).
  EXPECT_NEAR(kernels::gelu(1.0), 0.8413447460685429, 1e-15);
  EXPECT_NEAR(kernels::gelu(-2.0), -0.04550026389635842, 1e-15);
}

// GPT-2's tanh GELU through the forward that keeps its derivative, against the textbook formula
// in double (z/2 (1 + tanh u)) and its derivative, over [-12, 12] where tanh saturates on both
// sides; the backward multiplies by what the forward kept.
double gelu_tanh_ref(double z) {
  const double u = std::sqrt(2.0 / M_PI) * (z + 0.044715 * z * z * z);
  return 0.5 * z * (1.0 + std::tanh(u));
}
double gelu_tanh_grad_ref(double z) {
  const double c = std::sqrt(2.0 / M_PI), t = std::tanh(c * (z + 0.044715 * z * z * z));
  return 0.5 * (1.0 + t) + 0.5 * z * (1.0 - t * t) * c * (1.0 + 3.0 * 0.044715 * z * z);
}

TYPED_TEST(KernelTest, GeluTanhMatchesGpt2sFormula) {
  using T = TypeParam;
  const std::size_t rows = 77, cols = 13, n = rows * cols;
  auto z = random_vector<T>(n, 9, -12, 12);
  z[0] = T(-40), z[1] = T(40), z[2] = T(0), z[3] = T(-1e-6);
  const auto dy = random_vector<T>(n, 10);
  const ExecSpace exec;
  Vector<T> d_b("b", cols);  // zeros
  auto d_zd = to_device(z, rows, cols);
  auto d_db = Vector<T>("db", cols);
  Matrix<T> d_y("y", rows, cols), d_dz("dz", rows, cols);
  kernels::gelu_forward_saving_derivative(exec, d_b, d_zd, d_y, d_zd, true);
  kernels::gelu_backward_saved(exec, d_zd, to_device(dy, rows, cols), d_dz, d_db);
  const auto y = to_host(d_y), dz = to_host(d_dz);
  for (std::size_t i = 0; i < n; ++i) {
    EXPECT_NEAR(y[i], gelu_tanh_ref(double(z[i])), 4 * tolerance<T>() * (1 + std::abs(z[i]))) << z[i];
    EXPECT_NEAR(dz[i], double(dy[i]) * gelu_tanh_grad_ref(double(z[i])), 8 * tolerance<T>() * (1 + std::abs(dy[i])))
        << z[i];
  }
  // Known values (PyTorch: F.gelu(torch.tensor([1.0, -2.0], dtype=torch.float64), approximate="tanh")).
  EXPECT_NEAR(kernels::gelu_tanh(1.0), 0.8411919906082768, 1e-15);
  EXPECT_NEAR(kernels::gelu_tanh(-2.0), -0.04540230591222494, 1e-15);
}

// The bf16 forms the MLP uses under bf16 activations: the forward's output stored rounded to
// bf16, and the backward that writes dz in fp32 (in place here) and rounded to bf16, each the bits
// of the fp32 kernel's result rounded once.
TEST(Activations, Bf16OutputsAreTheFp32ResultsRounded) {
  const std::size_t n = 1001;
  const auto z = random_vector<float>(n, 7, -6, 6), dy = random_vector<float>(n, 8);
  const ExecSpace exec;
  for (const bool relu : {true, false}) {
    SCOPED_TRACE(relu ? "relu" : "gelu");
    auto d_z = to_device(z), d_dy = to_device(dy), d_g = to_device(dy);
    Vector<float> y("y", n), dz("dz", n);
    Vector<std::uint16_t> y16("y16", n), dz16("dz16", n);
    if (relu) {
      kernels::relu_forward(exec, d_z, y);
      kernels::relu_forward(exec, d_z, y16);
      kernels::relu_backward(exec, d_z, d_dy, dz);
      kernels::activation_backward_twice<kernels::ReluGrad>(exec, d_z, d_g, d_g, dz16);
    } else {
      kernels::gelu_forward(exec, d_z, y);
      kernels::gelu_forward(exec, d_z, y16);
      kernels::gelu_backward(exec, d_z, d_dy, dz);
      kernels::activation_backward_twice<kernels::GeluGrad>(exec, d_z, d_g, d_g, dz16);
    }
    const auto hy = to_host(y), hdz = to_host(dz), hg = to_host(d_g);
    const auto hy16 = to_host(y16), hdz16 = to_host(dz16);
    for (std::size_t i = 0; i < n; ++i) {
      ASSERT_EQ(hy16[i], kernels::to_bf16_bits(hy[i])) << i;
      ASSERT_EQ(hg[i], hdz[i]) << i;
      ASSERT_EQ(hdz16[i], kernels::to_bf16_bits(hdz[i])) << i;
    }
  }
}

// --- Bias ------------------------------------------------------------------------------------

TYPED_TEST(KernelTest, BiasBroadcastAddAndColumnSums) {
  using T = TypeParam;
  const std::size_t rows = 37, cols = 19;
  const auto b = random_vector<T>(cols, 5), y0 = random_vector<T>(rows * cols, 6);
  const auto dy = random_vector<T>(rows * cols, 7), db0 = random_vector<T>(cols, 8);
  auto d_b = to_device(b), d_db = to_device(db0);
  auto d_y = to_device(y0, rows, cols), d_dy = to_device(dy, rows, cols);
  const ExecSpace exec;

  kernels::bias_add(exec, d_b, d_y);
  auto y = to_host(d_y);
  for (std::size_t i = 0; i < rows; ++i)
    for (std::size_t j = 0; j < cols; ++j) EXPECT_EQ(y[i * cols + j], T(y0[i * cols + j] + b[j]));

  // The row-parallel bias and the residual stream in one pass.
  const auto r = random_vector<T>(rows * cols, 9);
  kernels::bias_residual_add(exec, d_b, to_device(r, rows, cols), d_y);
  const auto y_before = y;
  y = to_host(d_y);
  for (std::size_t i = 0; i < rows; ++i)
    for (std::size_t j = 0; j < cols; ++j)
      EXPECT_EQ(y[i * cols + j], T(y_before[i * cols + j] + T(b[j] + r[i * cols + j])));

  kernels::bias_broadcast(exec, d_b, d_y);
  y = to_host(d_y);
  for (std::size_t i = 0; i < rows; ++i)
    for (std::size_t j = 0; j < cols; ++j) EXPECT_EQ(y[i * cols + j], b[j]);

  // db accumulates the column sums onto what it held.
  kernels::bias_backward(exec, d_dy, d_db);
  const auto db = to_host(d_db);
  for (std::size_t j = 0; j < cols; ++j) {
    double sum = db0[j];
    for (std::size_t i = 0; i < rows; ++i) sum += dy[i * cols + j];
    EXPECT_NEAR(db[j], sum, 20 * tolerance<T>()) << "column " << j;
  }
}

// --- Softmax cross-entropy -------------------------------------------------------------------

struct XentRef {
  double loss = 0;
  std::int64_t correct = 0;
  std::vector<double> grad;
};

template <class T>
XentRef xent_ref(const std::vector<T>& logits, const std::vector<std::int32_t>& labels,
                 std::size_t classes, double scale) {
  XentRef r;
  r.grad.resize(logits.size());
  for (std::size_t i = 0; i < labels.size(); ++i) {
    const T* l = &logits[i * classes];
    const std::size_t arg = std::size_t(std::max_element(l, l + classes) - l);  // first max
    r.correct += arg == std::size_t(labels[i]) ? 1 : 0;
    const double m = double(l[arg]);
    double sum = 0;
    for (std::size_t c = 0; c < classes; ++c) sum += std::exp(double(l[c]) - m);
    const double lse = m + std::log(sum);
    r.loss += lse - double(l[labels[i]]);
    for (std::size_t c = 0; c < classes; ++c)
      r.grad[i * classes + c] = scale * (std::exp(double(l[c]) - lse) - (int(c) == labels[i]));
  }
  return r;
}

template <class T>
void check_xent(const std::vector<T>& logits, const std::vector<std::int32_t>& labels,
                std::size_t classes, double scale) {
  const std::size_t rows = labels.size();
  auto d_logits = to_device(logits, rows, classes);
  auto d_labels = to_device(labels);
  Matrix<T> d_grad("dlogits", rows, classes);
  const auto got = kernels::softmax_xent(ExecSpace(), d_logits, d_labels, T(scale), d_grad);
  const auto ref = xent_ref(logits, labels, classes, scale);
  EXPECT_NEAR(got.loss_sum, ref.loss, 10 * tolerance<T>() * (rows + ref.loss));
  EXPECT_EQ(got.correct, ref.correct);
  const auto grad = to_host(d_grad);
  for (std::size_t i = 0; i < grad.size(); ++i)
    EXPECT_NEAR(grad[i], ref.grad[i], 10 * tolerance<T>() * std::abs(scale)) << i;
  EXPECT_TRUE(std::all_of(grad.begin(), grad.end(), [](T g) { return std::isfinite(g); }));
}

TYPED_TEST(KernelTest, SoftmaxXentMatchesReference) {
  using T = TypeParam;
  const std::size_t rows = 64, classes = 10;
  const auto logits = random_vector<T>(rows * classes, 9, -4, 4);
  std::vector<std::int32_t> labels(rows);
  for (std::size_t i = 0; i < rows; ++i) labels[i] = std::int32_t((i * 7) % classes);
  check_xent(logits, labels, classes, 1.0 / 256);
}

TYPED_TEST(KernelTest, SoftmaxXentIsStableForLargeLogits) {
  using T = TypeParam;
  const std::size_t rows = 8, classes = 5;
  auto logits = random_vector<T>(rows * classes, 10, -5, 5);
  for (auto& l : logits) l += T(1000);  // exp(1000) overflows without the max shift
  logits[3] = T(-1000);
  std::vector<std::int32_t> labels = {0, 1, 2, 3, 4, 0, 1, 2};
  check_xent(logits, labels, classes, 1.0);
  // And a loss of exactly log(C) for equal logits of any size.
  std::vector<T> equal(rows * classes, T(5e4));
  auto d_logits = to_device(equal, rows, classes);
  Matrix<T> d_grad("dlogits", rows, classes);
  const auto got = kernels::softmax_xent(ExecSpace(), d_logits, to_device(labels), T(1), d_grad);
  EXPECT_NEAR(got.loss_sum, rows * std::log(double(classes)), 1e-5);
}

TYPED_TEST(KernelTest, SoftmaxXentArgmaxTiesTakeTheLowestIndex) {
  using T = TypeParam;
  // Row 0: classes 1 and 3 tie for the max; label 1 is correct, label 3 (row 1) is not.
  const std::vector<T> logits = {0, 2, 1, 2, /**/ 0, 2, 1, 2, /**/ 5, 5, 5, 5};
  const std::vector<std::int32_t> labels = {1, 3, 0};
  auto d_logits = to_device(logits, 3, 4);
  Matrix<T> d_grad("dlogits", 3, 4);
  const auto got = kernels::softmax_xent(ExecSpace(), d_logits, to_device(labels), T(1), d_grad);
  EXPECT_EQ(got.correct, 2);
  check_xent(logits, labels, 4, 0.5);
}

TYPED_TEST(KernelTest, SoftmaxXentInPlaceGradient) {
  using T = TypeParam;
  const std::size_t rows = 16, classes = 7;
  const auto logits = random_vector<T>(rows * classes, 11, -3, 3);
  std::vector<std::int32_t> labels(rows);
  for (std::size_t i = 0; i < rows; ++i) labels[i] = std::int32_t(i % classes);
  auto d_logits = to_device(logits, rows, classes);
  const auto got = kernels::softmax_xent(ExecSpace(), d_logits, to_device(labels), T(1), d_logits);
  const auto ref = xent_ref(logits, labels, classes, 1.0);
  EXPECT_NEAR(got.loss_sum, ref.loss, 10 * tolerance<T>() * (rows + ref.loss));
  const auto grad = to_host(d_logits);
  for (std::size_t i = 0; i < grad.size(); ++i) EXPECT_NEAR(grad[i], ref.grad[i], 10 * tolerance<T>());
}

// --- MSE -------------------------------------------------------------------------------------

TYPED_TEST(KernelTest, MseMatchesReference) {
  using T = TypeParam;
  const std::size_t rows = 23, k = 3;
  const double scale = 0.125;
  const auto pred = random_vector<T>(rows * k, 12, -2, 2), target = random_vector<T>(rows * k, 13);
  auto d_pred = to_device(pred, rows, k), d_target = to_device(target, rows, k);
  Matrix<T> d_grad("dpred", rows, k);
  const double loss = kernels::mse(ExecSpace(), d_pred, d_target, T(scale), d_grad);
  double ref = 0;
  const auto grad = to_host(d_grad);
  for (std::size_t i = 0; i < rows; ++i) {
    double row = 0;
    for (std::size_t c = 0; c < k; ++c) {
      const double diff = double(pred[i * k + c]) - double(target[i * k + c]);
      row += diff * diff;
      EXPECT_NEAR(grad[i * k + c], scale * 2 * diff / k, 10 * tolerance<T>());
    }
    ref += row / k;
  }
  EXPECT_NEAR(loss, ref, 10 * tolerance<T>() * ref);
}

// --- Optimizers ------------------------------------------------------------------------------

struct SgdCase {
  double momentum, weight_decay;
  bool nesterov;
};

TYPED_TEST(KernelTest, SgdMatchesPyTorchFormulasOverSteps) {
  using T = TypeParam;
  const std::size_t n = 257;
  for (const SgdCase c : {SgdCase{0.0, 0.0, false}, SgdCase{0.9, 0.0, false},
                          SgdCase{0.9, 1e-2, false}, SgdCase{0.8, 5e-3, true}}) {
    SCOPED_TRACE(::testing::Message() << "momentum " << c.momentum << " wd " << c.weight_decay
                                      << " nesterov " << c.nesterov);
    kernels::SgdHyper h;
    h.lr = 0.05;
    h.momentum = c.momentum;
    h.weight_decay = c.weight_decay;
    h.nesterov = c.nesterov;
    std::vector<double> p(n), buf(n, 0.0);
    const auto p0 = random_vector<T>(n, 14);
    for (std::size_t i = 0; i < n; ++i) p[i] = p0[i];
    auto d_p = to_device(p0);
    Vector<T> d_buf("buf", c.momentum != 0 ? n : 0);
    for (int step = 1; step <= 5; ++step) {
      const auto grad = random_vector<T>(n, 100 + step);
      kernels::sgd_step(ExecSpace(), d_p, to_device(grad), d_buf, h);
      // PyTorch torch.optim.SGD (dampening 0), written the naive way.
      for (std::size_t i = 0; i < n; ++i) {
        double g = grad[i] + c.weight_decay * p[i];
        if (c.momentum != 0) {
          buf[i] = step == 1 ? g : c.momentum * buf[i] + g;
          g = c.nesterov ? g + c.momentum * buf[i] : buf[i];
        }
        p[i] -= h.lr * g;
      }
    }
    const auto got = to_host(d_p);
    for (std::size_t i = 0; i < n; ++i) EXPECT_NEAR(got[i], p[i], 20 * tolerance<T>()) << i;
  }
}

TYPED_TEST(KernelTest, AdamWMatchesPyTorchFormulasOverSteps) {
  using T = TypeParam;
  const std::size_t n = 257;
  kernels::AdamWHyper h;
  h.lr = 1e-2;
  h.beta1 = 0.9;
  h.beta2 = 0.99;
  h.eps = 1e-8;
  h.weight_decay = 0.05;
  std::vector<double> p(n), m(n, 0.0), v(n, 0.0);
  const auto p0 = random_vector<T>(n, 15);
  for (std::size_t i = 0; i < n; ++i) p[i] = p0[i];
  auto d_p = to_device(p0);
  Vector<T> d_m("m", n), d_v("v", n);
  for (int t = 1; t <= 7; ++t) {
    const auto grad = random_vector<T>(n, 200 + t);
    kernels::adamw_step(ExecSpace(), d_p, to_device(grad), d_m, d_v, h, t);
    for (std::size_t i = 0; i < n; ++i) {
      const double g = grad[i];
      p[i] *= 1 - h.lr * h.weight_decay;
      m[i] = h.beta1 * m[i] + (1 - h.beta1) * g;
      v[i] = h.beta2 * v[i] + (1 - h.beta2) * g * g;
      const double mhat = m[i] / (1 - std::pow(h.beta1, t));
      const double vhat = v[i] / (1 - std::pow(h.beta2, t));
      p[i] -= h.lr * mhat / (std::sqrt(vhat) + h.eps);
    }
  }
  const auto got = to_host(d_p);
  for (std::size_t i = 0; i < n; ++i) EXPECT_NEAR(got[i], p[i], 50 * tolerance<T>()) << i;
  EXPECT_THROW(kernels::adamw_step(ExecSpace(), d_p, d_p, d_m, d_v, h, 0), std::invalid_argument);
}

// The update's extras (a factor on the gradients, the bf16 copies of the updated parameters)
// give what a separate scaling pass, the step and a separate rounding pass give: bit for bit for
// AdamW; SGD's g = grad * factor + wd * p may become one FMA, so within a rounding of it.
TEST(UpdateExtras, EqualSeparatePasses) {
  const std::size_t n = 1031;
  const float factor = 0.37f;
  kernels::AdamWHyper ha;
  ha.lr = 3e-3;
  ha.weight_decay = 0.1;
  kernels::SgdHyper hs;
  hs.lr = 0.05;
  hs.momentum = 0.9;
  hs.weight_decay = 1e-3;
  for (const bool adamw : {true, false}) {
    auto d_p = to_device(random_vector<float>(n, 31)), d_q = to_device(random_vector<float>(n, 31));
    Vector<float> m1("m1", n), v1("v1", n), m2("m2", n), v2("v2", n);
    Vector<std::uint16_t> copies("bf16", n);
    for (int t = 1; t <= 3; ++t) {
      const auto grad = random_vector<float>(n, 40 + t, -2, 2);
      auto g1 = to_device(grad), g2 = to_device(grad);
      // Separate passes.
      kernels::scale(ExecSpace(), g1, factor);
      if (adamw) kernels::adamw_step(ExecSpace(), d_p, g1, m1, v1, ha, t);
      else kernels::sgd_step(ExecSpace(), d_p, g1, m1, hs);
      // One pass.
      const kernels::UpdateExtras extras{factor, copies};
      if (adamw) kernels::adamw_step(ExecSpace(), d_q, g2, m2, v2, ha, t, extras);
      else kernels::sgd_step(ExecSpace(), d_q, g2, m2, hs, extras);
      const auto p = to_host(d_p), q = to_host(d_q);
      const auto c = to_host(copies);
      for (std::size_t i = 0; i < n; ++i) {
        if (adamw) ASSERT_EQ(p[i], q[i]) << "adamw step " << t << " at " << i;
        else ASSERT_NEAR(p[i], q[i], 1e-6f * (1.0f + std::abs(p[i]))) << "sgd step " << t << " at " << i;
        ASSERT_EQ(c[i], kernels::to_bf16_bits(q[i])) << i;
      }
    }
  }
  Vector<std::uint16_t> short_copies("bf16", n - 1);
  Vector<float> p("p", n), g("g", n), m("m", n), v("v", n);
  EXPECT_THROW(kernels::adamw_step(ExecSpace(), p, g, m, v, ha, 1, kernels::UpdateExtras{1.0, short_copies}),
               std::invalid_argument);
}

// --- Reductions and conversion ---------------------------------------------------------------

TYPED_TEST(KernelTest, SumSquaresScaleAllFinite) {
  using T = TypeParam;
  const std::size_t n = 4099;
  const auto x = random_vector<T>(n, 16, -3, 3);
  auto d_x = to_device(x);
  double ref = 0;
  for (const T v : x) ref += double(v) * double(v);
  EXPECT_NEAR(kernels::sum_squares(ExecSpace(), d_x), ref, 1e-12 * ref);

  kernels::scale(ExecSpace(), d_x, T(0.5));
  const auto scaled = to_host(d_x);
  for (std::size_t i = 0; i < n; ++i) EXPECT_EQ(scaled[i], T(x[i] * T(0.5)));

  EXPECT_TRUE(kernels::all_finite(ExecSpace(), d_x));
  for (const T bad : {std::numeric_limits<T>::quiet_NaN(), std::numeric_limits<T>::infinity(),
                      -std::numeric_limits<T>::infinity()}) {
    auto y = x;
    y[n / 2] = bad;
    EXPECT_FALSE(kernels::all_finite(ExecSpace(), to_device(y)));
  }
}

TYPED_TEST(KernelTest, ConvertScalesAndCasts) {
  using T = TypeParam;
  std::vector<std::uint8_t> bytes = {0, 1, 127, 255};
  Vector<T> d_out("out", bytes.size());
  kernels::convert(ExecSpace(), to_device(bytes), d_out, 1.0 / 255, -0.5);
  const auto out = to_host(d_out);
  for (std::size_t i = 0; i < bytes.size(); ++i)
    EXPECT_NEAR(out[i], bytes[i] / 255.0 - 0.5, tolerance<T>());
}

TEST(Flat, RejectsStridedViews) {
  Matrix<double> m("m", 4, 6);
  EXPECT_EQ(flat(m).extent(0), 24u);
  auto column = Kokkos::subview(m, Kokkos::ALL, Kokkos::make_pair(0, 3));
  EXPECT_THROW(flat(column), std::invalid_argument);
}

}  // namespace
