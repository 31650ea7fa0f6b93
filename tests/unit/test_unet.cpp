// The U-Net (model.kind = "unet") on one rank: its up-sampling kernels against naive loops, and
// every parameter gradient of a whole UNet<double> (three levels: two poolings, two up-samplings
// with skip connections, the 1x1 head) and its loss against finite differences.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <vector>

#include "gradient_check.hpp"
#include "kernel_test_util.hpp"
#include "kernels/upsample.hpp"
#include "nn/param_store.hpp"
#include "nn/unet.hpp"

namespace {

using namespace tessera;
using tessera::test::expect_gradient;
using tessera::test::Flat;
using tessera::test::random_vector;
using tessera::test::to_device;
using tessera::test::to_host;

TEST(Upsample, ScatterAndGatherMatchNaiveTransposedConvolutionLayout) {
  const ExecSpace exec;
  const Index B = 2, C = 3, h = 2, w = 3, H = 2 * h, W = 2 * w;
  const auto hy = random_vector<double>(std::size_t(B * C * 4 * h * w), 1, -1, 1);
  const auto hb = random_vector<double>(std::size_t(C), 2, -1, 1);
  const Vector<double> yp = to_device(hy), bias = to_device(hb);
  Vector<double> out("out", std::size_t(B * C * H * W)), back("back", hy.size());
  kernels::upsample2_scatter(exec, yp.data(), bias, B, C, h, w, out.data(), C * H * W);
  kernels::upsample2_gather(exec, static_cast<const double*>(out.data()), C * H * W, B, C, h, w, back.data());
  const auto ho = to_host(out), hback = to_host(back);
  for (Index b = 0; b < B; ++b)
    for (Index c = 0; c < C; ++c)
      for (Index y = 0; y < H; ++y)
        for (Index x = 0; x < W; ++x) {
          // Pixel (y/2, x/2) of channel c's (dy, dx) = (y%2, x%2) product row.
          const double want = hb[std::size_t(c)] +
                              hy[std::size_t(((b * C + c) * 4 + (y % 2) * 2 + x % 2) * h * w + (y / 2) * w + x / 2)];
          EXPECT_EQ(ho[std::size_t(((b * C + c) * H + y) * W + x)], want);
        }
  // The gather reads back what the scatter wrote: yp + bias.
  for (std::size_t i = 0; i < hy.size(); ++i)
    EXPECT_EQ(hback[i], hy[i] + hb[i / std::size_t(4 * h * w) % std::size_t(C)]);
}

void check_gradients(Activation act, bool normalize = false) {
  const ExecSpace exec;
  nn::ParamStore<double> store;
  nn::UNetShape shape;
  shape.in_channels = 2;
  shape.out_channels = 1;
  shape.height = shape.field_height = 8;
  shape.width = 4;
  shape.levels = {2, 3, 2};
  shape.kernel = 3;
  shape.activation = act;
  if (normalize) shape.norm = {{0.5, -0.25}, {2.0, 0.5}, {0.3}, {0.05}};
  nn::UNet<double> net(store, shape);
  store.allocate();
  store.initialize(exec, 7);
  const int batch = 2;
  net.reserve(batch);
  const int slot = net.acquire(batch);
  const auto width = std::size_t(net.input_width());
  const auto hx = random_vector<double>(batch * width, 5, -1, 1);
  const auto ht = random_vector<double>(std::size_t(batch * net.output_width()), 6, -1, 1);
  Kokkos::deep_copy(net.input(slot), to_device(hx, std::size_t(batch), width));
  const Matrix<double> targets = to_device(ht, std::size_t(batch), std::size_t(net.output_width()));
  nn::LossSums last;
  const auto loss = [&] {
    net.forward(exec, slot);
    last = net.loss(exec, slot, VectorU<const std::int32_t>(), targets, 1.0);
    return last.loss;
  };
  store.zero_grads(exec);
  loss();
  net.backward(exec, slot);
  // The loss is the sum over samples of each field's mean squared error (of the standardised
  // fields: divided by out_std^2), rel_l2 its relative L2 in the targets' units.
  const auto out = to_host(net.output(slot));
  const double out_var = normalize ? 0.05 * 0.05 : 1.0;
  double expect_loss = 0, expect_rel = 0;
  for (std::size_t b = 0; b < batch; ++b) {
    double err = 0, ref = 0;
    for (std::size_t k = 0; k < std::size_t(net.output_width()); ++k) {
      const double d = out[b * std::size_t(net.output_width()) + k] - ht[b * std::size_t(net.output_width()) + k];
      err += d * d;
      ref += ht[b * std::size_t(net.output_width()) + k] * ht[b * std::size_t(net.output_width()) + k];
    }
    expect_loss += err / out_var / net.output_width();
    expect_rel += std::sqrt(err / ref);
  }
  EXPECT_NEAR(last.loss, expect_loss, 1e-12);
  EXPECT_NEAR(last.rel_l2, expect_rel, 1e-12);
  const auto grads = to_host(store.grads());
  for (const auto& info : store.infos()) {
    SCOPED_TRACE(info.name);
    const std::vector<double> g(grads.begin() + long(info.offset), grads.begin() + long(info.offset + info.size));
    expect_gradient(info.name.c_str(), Flat(store.values().data() + info.offset, info.size), g, loss);
  }
  EXPECT_EQ(store.infos().front().name, "down.0.conv1.weight");
  EXPECT_EQ(store.infos().front().shape, (std::vector<std::int64_t>{2, 2, 3, 3}));
  EXPECT_EQ(store.infos().back().name, "head.bias");
}

TEST(UNet, GradientsMatchFiniteDifferencesGelu) { check_gradients(Activation::gelu); }
TEST(UNet, GradientsMatchFiniteDifferencesRelu) { check_gradients(Activation::relu); }
TEST(UNet, StandardisedFieldsGradientsMatchFiniteDifferences) { check_gradients(Activation::gelu, true); }

TEST(UNet, RefusesOddLevelsAndThinBlocks) {
  nn::ParamStore<double> store;
  nn::UNetShape odd;
  odd.height = odd.field_height = 6;  // pooled twice: 6 -> 3, odd at level 1
  odd.width = 8;
  odd.levels = {2, 2, 2};
  EXPECT_THROW(nn::UNet<double>(store, odd), std::invalid_argument);
  nn::ParamStore<double> other;
  nn::UNetShape thin;
  thin.height = 4;
  thin.field_height = 16;
  thin.width = 4;
  thin.levels = {2, 2, 2};  // level 2 holds one row per block
  thin.kernel = 5;           // a halo of two rows
  EXPECT_THROW(nn::UNet<double>(other, thin), std::invalid_argument);
}

}  // namespace
