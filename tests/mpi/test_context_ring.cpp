// Ring attention (nn/context_ring.cpp) over the world as one context group (1, 2 or 4 ranks), in
// double: each rank holds a head and a tail chunk of every sequence and the keys and values go
// around by point-to-point. Oracles: the whole model on each rank (same parameters, whole
// sequences): the loss, each rank's logit gradients at its positions, and every parameter
// gradient summed over the group; and finite differences of the ring's own loss, whose
// sequences cross every chunk boundary (the chunks are 1 and 2 positions long).
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdint>
#include <span>
#include <vector>

#include "../unit/gradient_check.hpp"
#include "../unit/kernel_test_util.hpp"
#include "mpi_test_util.hpp"
#include "nn/gpt.hpp"
#include "nn/param_store.hpp"

namespace {

using namespace tessera;
using tessera::test::to_device;
using tessera::test::to_host;
using tessera::test::expect_gradient;
using tessera::test::Flat;

/// The ring's wiring for a Gpt<double> on MPI_COMM_WORLD.
nn::Gpt<double>::Part ring_part(std::vector<MPI_Request>& pending, bool head_tail) {
  nn::Gpt<double>::Part part;
  part.sp = tessera::test::world_size();
  part.s = tessera::test::world_rank();
  part.ring = part.sp > 1;  // one rank: the whole sequence
  part.head_tail = part.ring && head_tail;
  part.spatial_sum = [](double* x, std::size_t n) {
    MPI_Allreduce(MPI_IN_PLACE, x, static_cast<int>(n), MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  };
  part.messages = [&pending](std::span<const nn::ContextMessage<double>> messages) {
    for (const auto& m : messages) {
      MPI_Request r;
      if (m.send) MPI_Isend(m.data, int(m.n), MPI_DOUBLE, m.peer, 5, MPI_COMM_WORLD, &r);
      else MPI_Irecv(m.data, int(m.n), MPI_DOUBLE, m.peer, 5, MPI_COMM_WORLD, &r);
      pending.push_back(r);
    }
  };
  part.wait = [&pending] {
    MPI_Waitall(int(pending.size()), pending.data(), MPI_STATUSES_IGNORE);
    pending.clear();
  };
  return part;
}

void scale_weights(nn::ParamStore<double>& s, const ExecSpace& exec) {
  s.allocate();
  s.initialize(exec, 17);
  // Larger than GPT-2's 0.02 so that every path carries weight.
  for (std::size_t p = 0; p < s.infos().size(); ++p)
    if (s.infos()[p].init == nn::InitKind::normal) {
      auto v = to_host(s.value(p));
      for (auto& x : v) x *= 20.0;
      Kokkos::deep_copy(s.value(p), to_device(v));
    }
  s.zero_grads(exec);
}

/// The ring (head and tail chunks) where shape.window is 0, else the window's halo (one block per
/// rank), against the whole model.
void expect_ring_equals_whole(const nn::GptShape& shape) {
  const bool head_tail = shape.window == 0;
  const int C = tessera::test::world_size(), r = tessera::test::world_rank();
  const int T = shape.context, n = T / C, c = n / 2, batch = 2;
  const ExecSpace exec;
  std::vector<MPI_Request> pending;
  nn::ParamStore<double> whole_store, ring_store;
  nn::Gpt<double> whole(whole_store, shape);
  nn::Gpt<double> ring(ring_store, shape, ring_part(pending, head_tail));
  scale_weights(whole_store, exec);
  scale_weights(ring_store, exec);
  // Position of local row t: chunks r and 2C - 1 - r, or block r.
  const auto position = [&](int t) {
    return !head_tail ? r * n + t : t < c ? r * c + t : (2 * C - 1 - r) * c + (t - c);
  };
  std::vector<double> tokens, mine;
  std::vector<std::int32_t> labels, my_labels;
  for (int b = 0; b < batch; ++b) {
    for (int t = 0; t < T; ++t) {
      tokens.push_back((b * 7 + t * 5 + 3) % shape.vocab);
      labels.push_back((b * 2 + t * 3 + 1) % shape.vocab);
    }
    for (int t = 0; t < n; ++t) {
      mine.push_back(tokens[std::size_t(b * T + position(t))]);
      my_labels.push_back(labels[std::size_t(b * T + position(t))]);
    }
  }
  const Vector<std::int32_t> d_labels = to_device(labels), d_mine = to_device(my_labels);
  const double scale = 1.0 / batch;
  whole.reserve(batch);
  ring.reserve(batch);
  const int ws = whole.acquire(batch), rs = ring.acquire(batch);
  Kokkos::deep_copy(whole.input(ws), to_device(tokens, std::size_t(batch), std::size_t(T)));
  Kokkos::deep_copy(ring.input(rs), to_device(mine, std::size_t(batch), std::size_t(n)));
  const auto ring_loss = [&] {
    ring.forward(exec, rs);
    return ring.loss(exec, rs, d_mine, MatrixU<const double>(), scale).loss;
  };
  whole.forward(exec, ws);
  const double whole_loss = whole.loss(exec, ws, d_labels, MatrixU<const double>(), scale).loss;
  whole.backward(exec, ws);
  const double loss = ring_loss();
  ring.backward(exec, rs);
  EXPECT_NEAR(loss, whole_loss, 1e-12 * std::abs(whole_loss));
  // dlogits: this rank's positions' rows of the whole model's.
  {
    const auto full = to_host(whole.grad_output(ws)), part = to_host(ring.grad_output(rs));
    const int V = shape.vocab;
    for (int b = 0; b < batch; ++b)
      for (int t = 0; t < n; ++t)
        for (int v = 0; v < V; ++v)
          EXPECT_NEAR(part[std::size_t((b * n + t) * V + v)], full[std::size_t((b * T + position(t)) * V + v)],
                      1e-12)
              << "sample " << b << " position " << position(t);
  }
  // Every parameter's gradient, summed over the group (as the data x spatial exchange sums it).
  std::vector<double> sums = to_host(ring_store.grads());
  MPI_Allreduce(MPI_IN_PLACE, sums.data(), int(sums.size()), MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  const std::vector<double> full = to_host(whole_store.grads());
  ASSERT_EQ(sums.size(), full.size());
  for (const auto& info : ring_store.infos()) {
    SCOPED_TRACE(info.name);
    for (std::size_t i = info.offset; i < info.offset + info.size; ++i)
      ASSERT_NEAR(sums[i], full[i], 1e-10 * (1.0 + std::abs(full[i]))) << i - info.offset;
  }
  // Finite differences of the ring's loss (every rank perturbs the same element) for the
  // attention's weights of block 0 and the embedding.
  for (const auto& info : ring_store.infos()) {
    if (info.name.find("blocks.0.attn") == std::string::npos && info.name != "wte.weight") continue;
    SCOPED_TRACE(info.name);
    const std::size_t count = std::min<std::size_t>(info.size, 12);
    const std::vector<double> g(sums.begin() + long(info.offset), sums.begin() + long(info.offset + count));
    expect_gradient(info.name.c_str(), Flat(ring_store.values().data() + info.offset, count), g,
                    [&] { return scale * ring_loss(); });  // loss() gives the sum; the gradient is scaled
  }
}

TEST(ContextRing, GptEqualsTheWholeModel) {
  // vocab 8, context 8 (chunks of 1 on 4 ranks, 2 on 2), width 8, 2 heads, 2 blocks.
  expect_ring_equals_whole(nn::GptShape{8, 8, 8, 2, 2});
}

// A window as long as the context is causal attention, through the halo: every preceding rank's
// whole block (multi-hop: up to 3 ranks back on 4).
TEST(ContextRing, WholeContextHaloEqualsTheWholeModel) {
  nn::GptShape s{8, 8, 8, 2, 2};
  s.window = 8;
  expect_ring_equals_whole(s);
}

TEST(ContextRing, LlamaWithSharedKeyValueHeadsEqualsTheWholeModel) {
  nn::GptShape s{8, 8, 16, 4, 2};  // 4 heads of 4 sharing 2 key/value heads, untied head
  s.llama = true;
  s.kv_heads = 2;
  s.ffn = 12;
  s.rope_theta = 3.0;
  s.norm_eps = 1e-5;
  s.tied = false;
  expect_ring_equals_whole(s);
}

}  // namespace
