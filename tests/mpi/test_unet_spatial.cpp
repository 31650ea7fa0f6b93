// Spatial parallelism on 1, 2 and 4 ranks: a UNet<double> whose fields are split into blocks of
// rows over the spatial group (halos exchanged through the Communicator, comm/halo_exchange.hpp)
// gives the whole-field network's outputs, loss and parameter gradients (summed over the group);
// the distributed loss's gradients match finite differences (the blocks' boundaries are crossed
// by every convolution); and the halo exchange moves the bytes its formula says. The same for a
// UNet<float> whose convolutions run through oneDNN (run.conv = "onednn": interior rows while the
// halo travels, then the boundary rows), against the double whole field within float's rounding.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <memory>
#include <type_traits>
#include <vector>

#include "../unit/gradient_check.hpp"
#include "../unit/kernel_test_util.hpp"
#include "blas/onednn_conv.hpp"
#include "comm/communicator.hpp"
#include "comm/halo_exchange.hpp"
#include "mpi_test_util.hpp"
#include "nn/param_store.hpp"
#include "nn/unet.hpp"
#include "train/spatial_halo.hpp"

namespace tessera {
namespace {

using tessera::test::random_vector;
using tessera::test::to_device;
using tessera::test::to_host;
using tessera::test::world_size;

constexpr int kBatch = 2, kC = 2, kH = 16, kW = 4;

// Rows [r0, r0 + h) of every (sample, channel) plane of x (B, C, H, W).
std::vector<double> block_of(const std::vector<double>& x, int channels, int r0, int h) {
  std::vector<double> out;
  for (int b = 0; b < kBatch; ++b)
    for (int c = 0; c < channels; ++c)
      for (int y = r0; y < r0 + h; ++y)
        for (int j = 0; j < kW; ++j) out.push_back(x[std::size_t(((b * channels + c) * kH + y) * kW + j)]);
  return out;
}

nn::UNetShape shape_for(int spatial, Activation act) {
  nn::UNetShape s;
  s.in_channels = kC;
  s.out_channels = 1;
  s.field_height = kH;
  s.height = kH / spatial;
  s.width = kW;
  s.levels = {2, 3};
  s.activation = act;
  return s;
}

/// The network on this rank's blocks in T (convolutions by `conv`) against the double one on whole
/// fields: T = double within 1e-12, float within 1e-5 (values) and 1e-4 (gradients).
template <class T>
void compare_with_whole_field(bool overlap, ConvLibrary conv = ConvLibrary::im2col) {
  const double tol = std::is_same_v<T, double> ? 1e-12 : 1e-5, gtol = std::is_same_v<T, double> ? 1e-10 : 1e-4;
  const ExecSpace exec;
  const int S = world_size();
  const Communicator comm(MPI_COMM_WORLD, GridShape{1, 1, 1, S});
  const int r = comm.rank(Group::spatial), h = kH / S;
  const auto hx = random_vector<double>(std::size_t(kBatch * kC * kH * kW), 11, -1, 1);
  const auto ht = random_vector<double>(std::size_t(kBatch * kH * kW), 12, -1, 1);

  nn::ParamStore<double> whole_store;
  nn::UNet<double> whole(whole_store, shape_for(1, Activation::gelu));
  whole_store.allocate();
  whole_store.initialize(exec, 5);
  whole.reserve(kBatch);
  const int ws = whole.acquire(kBatch);
  Kokkos::deep_copy(whole.input(ws), to_device(hx, kBatch, std::size_t(whole.input_width())));
  const Matrix<double> wt = to_device(ht, kBatch, std::size_t(whole.output_width()));
  whole_store.zero_grads(exec);
  whole.forward(exec, ws);
  const nn::LossSums wl = whole.loss(exec, ws, VectorU<const std::int32_t>(), wt, 1.0);
  whole.backward(exec, ws);

  const auto in_t = [](const std::vector<double>& v) { return std::vector<T>(v.begin(), v.end()); };
  nn::ParamStore<T> store;
  typename nn::UNet<T>::Part part;
  part.halo = std::make_shared<SpatialHalo<T>>(comm);
  part.overlap = overlap;
  part.conv = conv;
  nn::UNet<T> net(store, shape_for(S, Activation::gelu), part);
  store.allocate();
  Kokkos::deep_copy(store.values(), to_device(in_t(to_host(whole_store.values()))));
  net.reserve(kBatch);
  const int slot = net.acquire(kBatch);
  Kokkos::deep_copy(net.input(slot), to_device(in_t(block_of(hx, kC, r * h, h)), kBatch, std::size_t(net.input_width())));
  const Matrix<T> t = to_device(in_t(block_of(ht, 1, r * h, h)), kBatch, std::size_t(net.output_width()));
  store.zero_grads(exec);
  net.forward(exec, slot);
  nn::LossSums l = net.loss(exec, slot, VectorU<const std::int32_t>(), t, T(1));
  net.backward(exec, slot);

  // Outputs: this rank's block of the whole field's.
  const auto out = to_host(net.output(slot)), want = block_of(to_host(whole.output(ws)), 1, r * h, h);
  ASSERT_EQ(out.size(), want.size());
  for (std::size_t i = 0; i < out.size(); ++i) EXPECT_NEAR(out[i], want[i], tol) << "output " << i;
  // The loss counted once (spatial rank 0), the rest report zero.
  double sums[2] = {l.loss, l.rel_l2};
  EXPECT_TRUE(r == 0 || (l.loss == 0.0 && l.rel_l2 == 0.0));
  comm.allreduce_sum(sums, 2, Group::spatial);
  EXPECT_NEAR(sums[0], wl.loss, tol * std::abs(wl.loss));
  EXPECT_NEAR(sums[1], wl.rel_l2, tol * std::abs(wl.rel_l2));
  // Gradients: each rank's are partial sums over its rows; their sum is the whole field's.
  const auto tgrads = to_host(store.grads());
  std::vector<double> grads(tgrads.begin(), tgrads.end());
  comm.allreduce_sum(grads.data(), grads.size(), Group::spatial);
  const auto wg = to_host(whole_store.grads());
  ASSERT_EQ(grads.size(), wg.size());
  for (const auto& info : store.infos())
    for (std::size_t i = info.offset; i < info.offset + info.size; ++i)
      EXPECT_NEAR(grads[i], wg[i], gtol * std::max(1.0, std::abs(wg[i]))) << info.name << "[" << i - info.offset << "]";
  // Halo traffic: 4 convolutions (2 levels x 2) at the finest and coarsest levels, forward and
  // backward (the first layer sends no input gradient): each exchange sends batch x in-channels
  // x pad x W values to each neighbour.
  const auto stats = part.halo->stats();
  if (S == 1) {
    EXPECT_EQ(stats.exchanges, 0u);
  } else {
    const int neighbours = (r > 0) + (r + 1 < S);
    // Forward: convs (in channels, width): down.0 (2, 4), (2, 4); down.1 (2, 2), (3, 2); up.0 (4, 4), (2, 4).
    const std::uint64_t fwd = std::uint64_t(kBatch) * (2 * 4 + 2 * 4 + 2 * 2 + 3 * 2 + 4 * 4 + 2 * 4);
    const std::uint64_t bwd = fwd - std::uint64_t(kBatch) * 2 * 4;  // down.0.conv1 has no input gradient
    EXPECT_EQ(stats.exchanges, 11u);
    EXPECT_EQ(stats.bytes_sent, std::uint64_t(neighbours) * (fwd + bwd) * sizeof(T));
  }
}

TEST(UNetSpatial, BlocksGiveTheWholeFieldsOutputsLossAndGradients) { compare_with_whole_field<double>(true); }
TEST(UNetSpatial, WithoutOverlapTheSame) { compare_with_whole_field<double>(false); }

TEST(UNetSpatial, OnednnConvolutionsOnBlocksGiveTheWholeFields) {
  if (!blas::onednn::conv_available()) GTEST_SKIP() << "this build has no oneDNN";
  compare_with_whole_field<float>(true, ConvLibrary::onednn);
  compare_with_whole_field<float>(false, ConvLibrary::onednn);
}

TEST(UNetSpatial, DistributedGradientsMatchFiniteDifferences) {
  const ExecSpace exec;
  const int S = world_size();
  const Communicator comm(MPI_COMM_WORLD, GridShape{1, 1, 1, S});
  const int r = comm.rank(Group::spatial), h = kH / S;
  nn::ParamStore<double> store;
  nn::UNet<double>::Part part;
  part.halo = std::make_shared<SpatialHalo<double>>(comm);
  nn::UNet<double> net(store, shape_for(S, Activation::gelu), part);
  store.allocate();
  store.initialize(exec, 9);
  net.reserve(kBatch);
  const int slot = net.acquire(kBatch);
  const auto hx = random_vector<double>(std::size_t(kBatch * kC * kH * kW), 13, -1, 1);
  const auto ht = random_vector<double>(std::size_t(kBatch * kH * kW), 14, -1, 1);
  Kokkos::deep_copy(net.input(slot), to_device(block_of(hx, kC, r * h, h), kBatch, std::size_t(net.input_width())));
  const Matrix<double> t = to_device(block_of(ht, 1, r * h, h), kBatch, std::size_t(net.output_width()));
  const auto loss = [&] {
    net.forward(exec, slot);
    double l = net.loss(exec, slot, VectorU<const std::int32_t>(), t, 1.0).loss;
    comm.allreduce_sum(&l, 1, Group::spatial);
    return l;
  };
  store.zero_grads(exec);
  loss();
  net.backward(exec, slot);
  const auto tgrads = to_host(store.grads());
  std::vector<double> grads(tgrads.begin(), tgrads.end());
  comm.allreduce_sum(grads.data(), grads.size(), Group::spatial);
  for (const auto& info : store.infos()) {
    SCOPED_TRACE(info.name);
    const std::vector<double> g(grads.begin() + long(info.offset), grads.begin() + long(info.offset + info.size));
    tessera::test::expect_gradient(info.name.c_str(), tessera::test::Flat(store.values().data() + info.offset, info.size),
                                   g, loss);
  }
}

TEST(HaloExchange, NeighboursSwapTheirRows) {
  const int S = world_size();
  const Communicator comm(MPI_COMM_WORLD, GridShape{1, 1, 1, S});
  HaloExchange ex(comm, Group::spatial);
  const int r = ex.rank();
  std::vector<float> up(3, float(10 * r + 1)), down(3, float(10 * r + 2)), from_up(3, -1), from_down(3, -1);
  ex.start(up.data(), down.data(), from_up.data(), from_down.data(), 3);
  ex.finish();
  // From the rank above: what it sent down; from the rank below: what it sent up.
  EXPECT_EQ(from_up[0], r > 0 ? float(10 * (r - 1) + 2) : -1.0f);
  EXPECT_EQ(from_down[2], r + 1 < S ? float(10 * (r + 1) + 1) : -1.0f);
  EXPECT_EQ(ex.bytes_sent(), std::uint64_t((r > 0) + (r + 1 < S)) * 3 * sizeof(float));
}

}  // namespace
}  // namespace tessera
