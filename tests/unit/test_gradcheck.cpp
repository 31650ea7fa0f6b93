// Analytic gradients against central finite differences, in double precision:
// Linear, ReLU, GELU, softmax cross-entropy, MSE, and whole 2-hidden-layer MLPs.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <vector>

#include "gradient_check.hpp"
#include "kernel_test_util.hpp"
#include "kernels/activation.hpp"
#include "kernels/mse.hpp"
#include "kernels/softmax_xent.hpp"
#include "nn/linear.hpp"
#include "nn/loss.hpp"
#include "nn/mlp.hpp"
#include "nn/param_store.hpp"

namespace {

using namespace tessera;
using tessera::test::random_vector;
using tessera::test::to_device;
using tessera::test::to_host;

using tessera::test::dot;
using tessera::test::expect_gradient;
using tessera::test::Flat;

/// A flat view of a matrix's storage, for finite differences through a managed vector.
Flat flat_vector(const Matrix<double>& m) { return flat(m); }
Flat range_of(const Vector<double>& v, std::size_t offset, std::size_t size) {
  return Flat(v.data() + offset, size);
}


TEST(GradCheck, Linear) {
  const ExecSpace exec;
  const int batch = 3, in = 4, out = 5;
  nn::ParamStore<double> store;
  nn::Linear<double> layer(store, "layers.0", in, out);
  store.allocate();
  store.initialize(exec, 11);
  Matrix<double> x = to_device(random_vector<double>(batch * in, 1), batch, in);
  const auto r = random_vector<double>(batch * out, 2);  // L = sum(y * r), so dy = r
  Matrix<double> y("y", batch, out), dx("dx", batch, in);
  const Matrix<double> dy = to_device(r, batch, out);
  auto loss = [&] {
    layer.forward(exec, x, y);
    return dot(to_host(y), r);
  };
  store.zero_grads(exec);
  layer.backward(exec, x, dy, dx);
  const auto dw = to_host(store.grad(layer.weight_index()));
  const auto db = to_host(store.grad(layer.bias_index()));

  // The parameters are sub-ranges of the store's values: differentiate through those.
  const Vector<double> values = store.values();
  const auto w_off = store.infos()[layer.weight_index()].offset;
  const auto b_off = store.infos()[layer.bias_index()].offset;
  expect_gradient("dW", range_of(values, w_off, dw.size()), dw, loss);
  expect_gradient("db", range_of(values, b_off, db.size()), db, loss);
  expect_gradient("dx", flat_vector(x), to_host(dx), loss);

  // Backward accumulates: a second call doubles dW and db, and dx is overwritten, not added.
  layer.backward(exec, x, dy, dx);
  const auto dw2 = to_host(store.grad(layer.weight_index()));
  for (std::size_t i = 0; i < dw.size(); ++i) EXPECT_DOUBLE_EQ(dw2[i], 2 * dw[i]);
  EXPECT_EQ(to_host(store.grad(layer.bias_index()))[0], 2 * db[0]);
}

template <class Forward, class Backward>
void check_activation(const char* what, std::vector<double> z_host, Forward forward, Backward backward) {
  const ExecSpace exec;
  const std::size_t n = z_host.size();
  Vector<double> z = to_device(z_host), y("y", n), dz("dz", n);
  const auto r = random_vector<double>(n, 3);
  auto loss = [&] {
    forward(exec, z, y);
    return dot(to_host(y), r);
  };
  backward(exec, z, to_device(r), dz);
  expect_gradient(what, z, to_host(dz), loss);
}

TEST(GradCheck, Relu) {
  auto z = random_vector<double>(200, 4, -2, 2);
  for (auto& v : z) v += v >= 0 ? 0.1 : -0.1;  // away from the kink
  check_activation("relu", z,
                   [](const auto& e, const auto& a, const auto& b) { kernels::relu_forward(e, a, b); },
                   [](const auto& e, const auto& a, const auto& b, const auto& c) { kernels::relu_backward(e, a, b, c); });
}

TEST(GradCheck, Gelu) {
  check_activation("gelu", random_vector<double>(200, 5, -5, 5),
                   [](const auto& e, const auto& a, const auto& b) { kernels::gelu_forward(e, a, b); },
                   [](const auto& e, const auto& a, const auto& b, const auto& c) { kernels::gelu_backward(e, a, b, c); });
}

TEST(GradCheck, SoftmaxCrossEntropy) {
  const ExecSpace exec;
  const int batch = 6, classes = 7;
  const double scale = 1.0 / batch;
  Matrix<double> logits = to_device(random_vector<double>(batch * classes, 6, -3, 3), batch, classes);
  std::vector<std::int32_t> labels_host = {0, 6, 3, 3, 1, 5};
  const Vector<std::int32_t> labels = to_device(labels_host);
  Matrix<double> dlogits("dlogits", batch, classes), scratch("scratch", batch, classes);
  auto loss = [&] { return scale * kernels::softmax_xent(exec, logits, labels, scale, scratch).loss_sum; };
  kernels::softmax_xent(exec, logits, labels, scale, dlogits);
  expect_gradient("dlogits", flat_vector(logits), to_host(dlogits), loss);
}

TEST(GradCheck, MeanSquaredError) {
  const ExecSpace exec;
  const int batch = 5, k = 3;
  const double scale = 0.7;
  Matrix<double> pred = to_device(random_vector<double>(batch * k, 7, -2, 2), batch, k);
  const Matrix<double> target = to_device(random_vector<double>(batch * k, 8), batch, k);
  Matrix<double> dpred("dpred", batch, k), scratch("scratch", batch, k);
  auto loss = [&] { return scale * kernels::mse(exec, pred, target, scale, scratch); };
  kernels::mse(exec, pred, target, scale, dpred);
  expect_gradient("dpred", flat_vector(pred), to_host(dpred), loss);
}

/// Every parameter gradient of a 2-hidden-layer MLP against finite differences of the loss.
void check_mlp(Activation act, LossKind kind) {
  const ExecSpace exec;
  const int batch = 4, in = 5, out = 3;
  nn::ParamStore<double> store;
  nn::Mlp<double> mlp(store, in, {6, 4}, out, act);
  store.allocate();
  store.initialize(exec, 21);
  mlp.reserve(8);  // more than the batch: forward uses the first rows of its buffers

  const Matrix<double> x = to_device(random_vector<double>(batch * in, 9, -2, 2), batch, in);
  const Vector<std::int32_t> labels = to_device(std::vector<std::int32_t>{2, 0, 1, 2});
  const Matrix<double> target = to_device(random_vector<double>(batch * out, 10), batch, out);
  Matrix<double> dlogits("dlogits", batch, out);
  const double scale = 1.0 / batch;
  auto loss_and_grad = [&] {
    const MatrixU<double> logits = mlp.forward(exec, x);
    const nn::LossResult r =
        kind == LossKind::cross_entropy
            ? nn::cross_entropy<double>(exec, logits, labels, scale, dlogits)
            : nn::mean_squared_error<double>(exec, logits, target, scale, dlogits);
    return scale * r.loss_sum;
  };

  store.zero_grads(exec);
  loss_and_grad();
  mlp.backward(exec, dlogits);
  const Vector<double> values = store.values();
  for (std::size_t p = 0; p < store.infos().size(); ++p) {
    const auto& info = store.infos()[p];
    SCOPED_TRACE(info.name);
    expect_gradient(info.name.c_str(),
                    range_of(values, info.offset, info.size),
                    to_host(store.grad(p)), loss_and_grad);
  }
  EXPECT_EQ(store.infos().size(), 6u);
  EXPECT_EQ(store.infos()[4].name, "layers.2.weight");
}

TEST(GradCheck, MlpReluCrossEntropy) { check_mlp(Activation::relu, LossKind::cross_entropy); }
TEST(GradCheck, MlpGeluCrossEntropy) { check_mlp(Activation::gelu, LossKind::cross_entropy); }
TEST(GradCheck, MlpGeluMse) { check_mlp(Activation::gelu, LossKind::mse); }

TEST(Mlp, RejectsOversizedBatchAndMismatchedBackward) {
  nn::ParamStore<double> store;
  nn::Mlp<double> mlp(store, 3, {4}, 2, Activation::relu);
  store.allocate();
  mlp.reserve(2);
  const Matrix<double> x("x", 3, 3);
  EXPECT_THROW(mlp.forward(ExecSpace(), x), std::invalid_argument);
  const Matrix<double> x2("x2", 2, 3), d("d", 1, 2);
  mlp.forward(ExecSpace(), x2);
  EXPECT_THROW(mlp.backward(ExecSpace(), d), std::invalid_argument);
  EXPECT_THROW(nn::Mlp<double>(store, 3, {0}, 2, Activation::relu), std::invalid_argument);
}

}  // namespace
