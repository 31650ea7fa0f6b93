// The GPT split over the tensor group (every rank of the world: 1, 2 or 4), in double, against
// the whole model on each rank: the vocabulary-parallel cross-entropy gives the full loss and
// the full softmax gradient's columns of this rank, and every parameter gradient is this rank's
// block of the whole model's (heads, MLP slice, vocabulary rows; replicated parameters whole).
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdint>
#include <vector>

#include "../unit/kernel_test_util.hpp"
#include "mpi_test_util.hpp"
#include "nn/gpt.hpp"
#include "nn/param_store.hpp"

namespace {

using namespace tessera;
using tessera::test::to_device;
using tessera::test::to_host;

TEST(GptTensorParallel, EqualsTheWholeModel) {
  const int tp = tessera::test::world_size(), t = tessera::test::world_rank();
  const nn::GptShape shape{8, 5, 8, 4, 2};  // vocab 8, context 5, width 8, 4 heads, 2 blocks
  const ExecSpace exec;
  nn::ParamStore<double> whole_store, part_store;
  nn::Gpt<double> whole(whole_store, shape);
  nn::Gpt<double>::Part part;
  part.tp = tp;
  part.t = t;
  part.tensor_sum = [](double* x, std::size_t n) {
    MPI_Allreduce(MPI_IN_PLACE, x, static_cast<int>(n), MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  };
  nn::Gpt<double> split(part_store, shape, part);
  for (auto* s : {&whole_store, &part_store}) {
    s->allocate();
    s->initialize(exec, 17);
    // Larger than GPT-2's 0.02 so that every path carries weight.
    for (std::size_t p = 0; p < s->infos().size(); ++p)
      if (s->infos()[p].init == nn::InitKind::normal) {
        auto v = to_host(s->value(p));
        for (auto& x : v) x *= 20.0;
        Kokkos::deep_copy(s->value(p), to_device(v));
      }
    s->zero_grads(exec);
  }
  const int batch = 3;
  std::vector<double> tokens;
  std::vector<std::int32_t> labels;
  for (int i = 0; i < batch * shape.context; ++i) {
    tokens.push_back((i * 5 + 3) % shape.vocab);
    labels.push_back((i * 3 + 1) % shape.vocab);
  }
  const Vector<std::int32_t> d_labels = to_device(labels);
  double losses[2];
  int k = 0;
  for (auto* g : {&whole, &split}) {
    g->reserve(batch);
    const int slot = g->acquire(batch);
    Kokkos::deep_copy(g->input(slot), to_device(tokens, std::size_t(batch), std::size_t(shape.context)));
    g->forward(exec, slot);
    losses[k++] = g->loss(exec, slot, d_labels, MatrixU<const double>(), 1.0 / batch).loss;
    g->backward(exec, slot);
  }
  EXPECT_NEAR(losses[0], losses[1], 1e-12 * std::abs(losses[0]));
  // dlogits: this rank's columns of the whole model's.
  {
    const auto full = to_host(whole.grad_output(0)), mine = to_host(split.grad_output(0));
    const int V = shape.vocab, Vl = V / tp;
    for (int r = 0; r < batch * shape.context; ++r)
      for (int v = 0; v < Vl; ++v)
        EXPECT_NEAR(mine[std::size_t(r * Vl + v)], full[std::size_t(r * V + t * Vl + v)], 1e-12);
  }
  // Every parameter: the block at block_offset of the whole model's gradient.
  for (const auto& info : part_store.infos()) {
    SCOPED_TRACE(info.name);
    const auto& w = whole_store.infos()[whole_store.find(info.name)];
    const auto full = to_host(whole_store.grad(whole_store.find(info.name)));
    const auto mine = to_host(part_store.grad(part_store.find(info.name)));
    ASSERT_EQ(info.logical_shape, w.shape);
    // Row-major walk of the local block (up to 3 dimensions, padded in front).
    std::vector<std::int64_t> dims(3, 1), offs(3, 0), full_dims(3, 1);
    const std::size_t pad = 3 - info.shape.size();
    for (std::size_t d = 0; d < info.shape.size(); ++d) {
      dims[pad + d] = info.shape[d];
      offs[pad + d] = info.block_offset[d];
      full_dims[pad + d] = w.shape[d];
    }
    std::size_t i = 0;
    for (std::int64_t a = 0; a < dims[0]; ++a)
      for (std::int64_t b = 0; b < dims[1]; ++b)
        for (std::int64_t c = 0; c < dims[2]; ++c, ++i) {
          const auto j = std::size_t(((a + offs[0]) * full_dims[1] + b + offs[1]) * full_dims[2] + c + offs[2]);
          EXPECT_NEAR(mine[i], full[j], 1e-11 * (1.0 + std::abs(full[j]))) << i;
        }
  }
}

}  // namespace
