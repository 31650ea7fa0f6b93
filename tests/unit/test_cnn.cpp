// The CNN: im2col convolution and max-pooling against naive loops; every parameter gradient of a
// whole Cnn<double> (two conv blocks, a hidden linear layer) against finite differences; the
// float CNN through oneDNN's convolutions (run.conv = "onednn") and through im2col against that
// finite-difference-checked double model on the same weights and inputs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "blas/gemm.hpp"
#include "blas/onednn_conv.hpp"
#include "gradient_check.hpp"
#include "kernel_test_util.hpp"
#include "kernels/conv2d.hpp"
#include "kernels/reduce.hpp"
#include "nn/cnn.hpp"
#include "nn/param_store.hpp"

namespace {

using namespace tessera;
using tessera::test::expect_gradient;
using tessera::test::Flat;
using tessera::test::random_vector;
using tessera::test::to_device;
using tessera::test::to_host;

TEST(Conv2d, Im2colGemmEqualsNaiveConvolutionAndPoolingEqualsNaive) {
  const ExecSpace exec;
  const Index B = 2, C = 3, H = 5, W = 4, K = 3, O = 2;
  const kernels::ConvShape s{C, H, W, K, K / 2};
  const auto hx = random_vector<double>(std::size_t(B * C * H * W), 1, -1, 1);
  const auto hw = random_vector<double>(std::size_t(O * C * K * K), 2, -1, 1);
  const Vector<double> x = to_device(hx), w = to_device(hw);
  Vector<double> col("col", std::size_t(B * s.rows() * s.positions())), y("y", std::size_t(B * O * H * W));
  kernels::im2col(exec, s, x.data(), col.data(), B);
  for (Index b = 0; b < B; ++b)
    blas::gemm(exec, blas::Op::N, blas::Op::N, int(O), int(H * W), int(s.rows()), 1.0, w.data(), int(s.rows()),
               col.data() + b * s.rows() * H * W, int(H * W), 0.0, y.data() + b * O * H * W, int(H * W));
  const auto hy = to_host(y);
  for (Index b = 0; b < B; ++b)
    for (Index o = 0; o < O; ++o)
      for (Index i = 0; i < H; ++i)
        for (Index j = 0; j < W; ++j) {
          double ref = 0;
          for (Index c = 0; c < C; ++c)
            for (Index ky = 0; ky < K; ++ky)
              for (Index kx = 0; kx < K; ++kx) {
                const Index yy = i + ky - 1, xx = j + kx - 1;
                if (yy < 0 || yy >= H || xx < 0 || xx >= W) continue;
                ref += hw[std::size_t(((o * C + c) * K + ky) * K + kx)] * hx[std::size_t(((b * C + c) * H + yy) * W + xx)];
              }
          EXPECT_NEAR(hy[std::size_t(((b * O + o) * H + i) * W + j)], ref, 1e-12);
        }
  Vector<double> p("p", std::size_t(B * O * (H / 2) * (W / 2)));
  Kokkos::View<std::int32_t*, Kokkos::LayoutRight, MemSpace> arg("arg", p.extent(0));
  kernels::maxpool2_forward(exec, B, O, H, W, y.data(), p.data(), arg.data());
  const auto hp = to_host(p);
  for (Index b = 0; b < B; ++b)
    for (Index o = 0; o < O; ++o)
      for (Index i = 0; i < H / 2; ++i)
        for (Index j = 0; j < W / 2; ++j) {
          double m = -1e300;
          for (Index di = 0; di < 2; ++di)
            for (Index dj = 0; dj < 2; ++dj) m = std::max(m, hy[std::size_t(((b * O + o) * H + 2 * i + di) * W + 2 * j + dj)]);
          EXPECT_EQ(hp[std::size_t(((b * O + o) * (H / 2) + i) * (W / 2) + j)], m);
        }
}

TEST(Cnn, GradientsMatchFiniteDifferences) {
  const ExecSpace exec;
  nn::ParamStore<double> store;
  nn::CnnShape shape;
  shape.channels = 1;
  shape.height = 7;  // odd: the pools drop a row and a column
  shape.width = 8;
  shape.conv = {2, 3};
  shape.hidden = {5};
  shape.classes = 3;
  nn::Cnn<double> cnn(store, shape);
  store.allocate();
  store.initialize(exec, 3);
  const int batch = 2;
  cnn.reserve(batch);
  const int slot = cnn.acquire(batch);
  const auto hx = random_vector<double>(std::size_t(batch * 56), 5, -1, 1);
  Kokkos::deep_copy(cnn.input(slot), to_device(hx, std::size_t(batch), 56));
  const Vector<std::int32_t> labels = to_device(std::vector<std::int32_t>{2, 0});
  const auto loss = [&] {
    cnn.forward(exec, slot);
    return 0.5 * cnn.loss(exec, slot, labels, MatrixU<const double>(), 0.5).loss;
  };
  store.zero_grads(exec);
  loss();
  cnn.backward(exec, slot);
  const auto grads = to_host(store.grads());
  for (const auto& info : store.infos()) {
    SCOPED_TRACE(info.name);
    const std::vector<double> g(grads.begin() + long(info.offset), grads.begin() + long(info.offset + info.size));
    expect_gradient(info.name.c_str(), Flat(store.values().data() + info.offset, info.size), g, loss);
  }
  EXPECT_EQ(store.infos().front().name, "convs.0.weight");
  EXPECT_EQ(store.infos().front().shape, (std::vector<std::int64_t>{2, 1, 3, 3}));
  EXPECT_EQ(store.infos().back().name, "fc.1.bias");
  EXPECT_THROW(nn::Cnn<double>(store, nn::CnnShape{1, 2, 2, {4, 4}, 3, {}, 2}), std::logic_error);  // after allocate
  nn::ParamStore<double> other;
  EXPECT_THROW(nn::Cnn<double>(other, nn::CnnShape{1, 2, 2, {4, 4}, 3, {}, 2}), std::invalid_argument);
}

/// Loss and gradients of one forward/backward of a CNN on (x, labels), backward run `passes`
/// times after one zero_grads (the gradients accumulate as micro-batches' do).
template <class T>
std::pair<double, std::vector<double>> loss_and_grads(nn::Cnn<T>& cnn, nn::ParamStore<T>& store,
                                                      const std::vector<double>& hx, int batch, int passes) {
  const ExecSpace exec;
  const int slot = cnn.acquire(batch);
  std::vector<T> x(hx.begin(), hx.end());
  Kokkos::deep_copy(cnn.input(slot), to_device(x, std::size_t(batch), x.size() / std::size_t(batch)));
  const Vector<std::int32_t> labels = to_device(std::vector<std::int32_t>{2, 0, 1});
  store.zero_grads(exec);
  double loss = 0;
  for (int p = 0; p < passes; ++p) {
    cnn.forward(exec, slot);
    loss = double(cnn.loss(exec, slot, labels, MatrixU<const T>(), T(0.5)).loss);
    cnn.backward(exec, slot);
  }
  exec.fence();
  cnn.release(slot);
  const auto g = to_host(store.grads());
  return {loss, std::vector<double>(g.begin(), g.end())};
}

TEST(Cnn, OnednnConvolutionsMatchTheDoubleModelAndIm2col) {
  if (!blas::onednn::conv_available()) GTEST_SKIP() << "this build has no oneDNN";
  const ExecSpace exec;
  nn::CnnShape shape;
  shape.channels = 3;
  shape.height = 9;  // odd: the pools drop a row and a column
  shape.width = 8;
  shape.conv = {16, 5};
  shape.hidden = {6};
  shape.classes = 3;
  const int batch = 3;
  nn::ParamStore<double> dstore;
  nn::Cnn<double> reference(dstore, shape);
  dstore.allocate();
  nn::ParamStore<float> fstore[2];
  std::vector<std::unique_ptr<nn::Cnn<float>>> nets;
  for (ConvLibrary lib : {ConvLibrary::onednn, ConvLibrary::im2col}) {
    nn::Cnn<float>::Part part;
    part.conv = lib;
    nn::ParamStore<float>& store = fstore[nets.size()];
    nets.push_back(std::make_unique<nn::Cnn<float>>(store, shape, part));
    store.allocate();
    store.initialize(exec, 3);
    nets.back()->reserve(batch);
  }
  ASSERT_TRUE(nets[0]->onednn());
  ASSERT_FALSE(nets[1]->onednn());
  // The same weights in the double model.
  const auto w = to_host(fstore[0].values());
  Kokkos::deep_copy(dstore.values(), to_device(std::vector<double>(w.begin(), w.end())));
  reference.reserve(batch);
  const auto hx = random_vector<double>(std::size_t(batch * 3 * 9 * 8), 7, -1, 1);
  const auto [want_loss, want] = loss_and_grads(reference, dstore, hx, batch, 1);
  for (std::size_t n = 0; n < nets.size(); ++n) {
    SCOPED_TRACE(n == 0 ? "onednn" : "im2col");
    const auto [loss, got] = loss_and_grads(*nets[n], fstore[n], hx, batch, 2);  // gradients twice over
    EXPECT_NEAR(loss, want_loss, 1e-5 * std::abs(want_loss));
    double scale = 0;
    for (double g : want) scale = std::max(scale, std::abs(g));
    ASSERT_EQ(got.size(), want.size());
    for (std::size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got[i], 2 * want[i], 1e-5 * scale) << "gradient " << i;
  }
}

}  // namespace
