// Each model kind's activation_bytes(max_batch, slots), what the memory estimate (`tessera check`,
// run.memory_limit_mb) asks, equals what its slots allocate, measured by the activation counters
// (core/memory.hpp): for the GPT whole, as first, middle and last pipeline stage, a tensor rank,
// with recomputation and in bf16; the MLP likewise; the CNN with im2col and oneDNN; the U-Net.
#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <span>
#include <string>

#include "blas/cblas_gemm.hpp"
#include "core/memory.hpp"
#include "nn/cnn.hpp"
#include "nn/gpt.hpp"
#include "nn/mlp.hpp"
#include "nn/param_store.hpp"
#include "nn/unet.hpp"

namespace {

using namespace tessera;

/// The activation bytes a network's first `slots` slots of `rows` rows allocate, as counted.
double allocated(nn::Network<float>& net, int rows, int slots) {
  mem::install_tracking();
  const std::size_t before = mem::current(mem::Category::act);
  net.reserve(rows);
  for (int k = 0; k < slots; ++k) net.acquire(rows);
  return double(mem::current(mem::Category::act) - before);
}

/// Expects net's activation_bytes to be what its slots allocate, for one slot and for three.
template <class Net, class... Args>
void expect_counted(const std::string& what, const Args&... args) {
  SCOPED_TRACE(what);
  for (int slots : {1, 3}) {
    nn::ParamStore<float> store;
    Net net(store, args...);
    const int rows = 3;
    const double said = net.activation_bytes(rows, slots);
    EXPECT_EQ(allocated(net, rows, slots), said) << slots << " slot(s)";
    EXPECT_GT(said, net.activation_bytes(rows, 0));
  }
}

void no_op_sbgemm(blas::Op, blas::Op, int, int, int, float, const std::uint16_t*, int, const std::uint16_t*, int,
                  float, float*, int) {}

/// Runs f with the host's bf16 GEMM present (a stand-in that is never called) and absent: bf16
/// models keep bf16 activations in the first case only.
void with_and_without_bf16_gemm(const std::function<void(const std::string&)>& f) {
  const blas::cblas::SbgemmFn previous = blas::cblas::set_sbgemm(&no_op_sbgemm);
  f("with a bf16 GEMM");
  blas::cblas::set_sbgemm(nullptr);
  f("without a bf16 GEMM");
  blas::cblas::set_sbgemm(previous);
}

TEST(ActivationMemory, GptCountsEveryBufferItsSlotsAllocate) {
  const nn::GptShape gpt{16, 6, 8, 2, 4};  // vocab 16, context 6, width 8, 2 heads, 4 blocks
  nn::GptShape llama{16, 6, 8, 4, 4};       // 4 heads on 2 key/value heads, SwiGLU of 12, untied
  llama.llama = true;
  llama.kv_heads = 2;
  llama.ffn = 12;
  llama.tied = false;
  const auto sum = [](float*, std::size_t) {};
  using Part = nn::Gpt<float>::Part;
  for (Precision p : {Precision::fp32, Precision::bf16})
    with_and_without_bf16_gemm([&](const std::string& gemm) {
      const auto part = [&](int first, int end, int tp, int t, bool recompute) {
        Part q;
        q.first_block = first;
        q.end_block = end;
        q.tp = tp;
        q.t = t;
        if (tp > 1) q.tensor_sum = sum;
        q.recompute = recompute;
        q.precision = p;
        return q;
      };
      for (const auto& [shape, kind] : {std::pair{gpt, "gpt"}, std::pair{llama, "llama"}}) {
        const std::string at = std::string(kind) + ", " + precision_name(p) + ", " + gemm;
        expect_counted<nn::Gpt<float>>("whole, " + at, shape, part(0, -1, 1, 0, false));
        expect_counted<nn::Gpt<float>>("recompute, " + at, shape, part(0, -1, 1, 0, true));
        expect_counted<nn::Gpt<float>>("first stage, " + at, shape, part(0, 1, 1, 0, false));
        expect_counted<nn::Gpt<float>>("middle stage, " + at, shape, part(1, 3, 1, 0, false));
        expect_counted<nn::Gpt<float>>("last stage, recompute, " + at, shape, part(3, -1, 1, 0, true));
        expect_counted<nn::Gpt<float>>("tensor rank 1 of 2, " + at, shape, part(0, -1, 2, 1, false));
        expect_counted<nn::Gpt<float>>("tensor rank, middle stage, recompute, " + at, shape, part(1, 2, 2, 0, true));
        // Under C > 1 the activations stay fp32 whatever the precision (keeps_bf16_activations).
        Part context = part(0, -1, 1, 0, false);  // context rank 1 of 2 (allocation only: nothing is called)
        context.sp = 2;
        context.s = 1;
        context.all_to_all = [](const float*, float*, std::size_t) {};
        context.spatial_sum = [](double*, std::size_t) {};
        expect_counted<nn::Gpt<float>>("context rank 1 of 2, " + at, shape, context);
        Part ring = context;  // the ring's buffers in place of the all-to-all's
        ring.all_to_all = nullptr;
        ring.ring = ring.head_tail = true;
        ring.messages = [](std::span<const nn::ContextMessage<float>>) {};
        ring.wait = [] {};
        nn::GptShape chunks = shape;  // two chunks per rank: 2C divides the context
        chunks.context = 8;
        expect_counted<nn::Gpt<float>>("ring context rank 1 of 2, " + at, chunks, ring);
      }
    });
}

TEST(ActivationMemory, MlpCountsEveryBufferItsSlotsAllocate) {
  const auto sum = [](float*, std::size_t) {};
  using Part = nn::Mlp<float>::Part;
  for (Precision p : {Precision::fp32, Precision::bf16})
    with_and_without_bf16_gemm([&](const std::string& gemm) {
      const std::string at = std::string(precision_name(p)) + ", " + gemm;
      const auto mlp = [&](const std::string& what, const Part& part) {
        expect_counted<nn::Mlp<float>>(what + ", " + at, 12, std::vector<int>{10, 8, 6}, 5, Activation::relu, part);
      };
      mlp("whole", Part{0, -1, 1, 0, {}, p});
      mlp("first stage", Part{0, 2, 1, 0, {}, p});
      mlp("middle stage", Part{1, 3, 1, 0, {}, p});
      mlp("last stage", Part{2, -1, 1, 0, {}, p});
      mlp("tensor rank 1 of 2", Part{0, -1, 2, 1, sum, p});
    });
}

TEST(ActivationMemory, CnnAndUNetCountEveryBufferTheirSlotsAllocate) {
  nn::CnnShape cnn;
  cnn.channels = 2;
  cnn.height = 9;
  cnn.width = 8;
  cnn.conv = {3, 4};
  cnn.hidden = {7};
  cnn.classes = 5;
  for (ConvLibrary conv : {ConvLibrary::im2col, ConvLibrary::automatic}) {
    nn::Cnn<float>::Part part;
    part.conv = conv;
    expect_counted<nn::Cnn<float>>(conv == ConvLibrary::im2col ? "cnn, im2col" : "cnn, run.conv auto", cnn, part);
  }
  nn::UNetShape unet;
  unet.in_channels = 2;
  unet.out_channels = 1;
  unet.field_height = unet.height = 8;
  unet.width = 8;
  unet.levels = {3, 4};
  unet.kernel = 3;
  expect_counted<nn::UNet<float>>("unet", unet, nn::UNet<float>::Part{});
}

}  // namespace
