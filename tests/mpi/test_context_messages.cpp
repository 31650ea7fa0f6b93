// What nn's context parallelism hands to each rank of the group in one training step of a Gpt
// (forward, loss, backward), counted at its callbacks, against train/context_traffic.hpp's
// bytes from that rank to that rank: the all-to-all, the ring and a sliding window's halo
// (multi-hop on 4 ranks), with and without recomputation, the gpt and a llama whose key/value heads
// are shared. The world is the context group (1, 2 or 4 ranks; one rank: no messages and no
// traffic). The halo is reached here before a deck can ask for it; the whole run's counters are
// Context.TrafficIsWhatTheRunCounts (tests/integration/test_context_runs.cpp).
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdint>
#include <span>
#include <vector>

#include "../unit/kernel_test_util.hpp"
#include "mpi_test_util.hpp"
#include "nn/gpt.hpp"
#include "nn/param_store.hpp"
#include "train/context_traffic.hpp"

namespace {

using namespace tessera;
using tessera::test::to_device;

struct Form {
  ContextComm comm;
  int window;
  bool llama;
};

/// Elements this rank handed to each rank of the world in one step of `form`, as 4-byte bytes.
std::vector<double> handed(const Form& form, bool recompute, const nn::GptShape& shape, int batch) {
  const int C = tessera::test::world_size(), r = tessera::test::world_rank();
  std::vector<double> to(static_cast<std::size_t>(C), 0.0);
  std::vector<MPI_Request> pending;
  nn::Gpt<double>::Part part;
  part.sp = C;
  part.s = r;
  part.recompute = recompute;
  part.spatial_sum = [](double* x, std::size_t n) {
    MPI_Allreduce(MPI_IN_PLACE, x, static_cast<int>(n), MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  };
  // Every rank gets per_rank elements of an all-to-all, this one included.
  part.all_to_all = [&](const double* send, double* recv, std::size_t per_rank) {
    for (auto& t : to) t += 4.0 * static_cast<double>(per_rank);
    MPI_Alltoall(send, int(per_rank), MPI_DOUBLE, recv, int(per_rank), MPI_DOUBLE, MPI_COMM_WORLD);
  };
  part.ring = C > 1 && form.comm == ContextComm::ring;
  part.head_tail = part.ring && form.window == 0;
  part.messages = [&](std::span<const nn::ContextMessage<double>> messages) {
    for (const auto& m : messages) {
      MPI_Request q;
      if (m.send) {
        to[static_cast<std::size_t>(m.peer)] += 4.0 * static_cast<double>(m.n);
        MPI_Isend(m.data, int(m.n), MPI_DOUBLE, m.peer, 5, MPI_COMM_WORLD, &q);
      } else {
        MPI_Irecv(m.data, int(m.n), MPI_DOUBLE, m.peer, 5, MPI_COMM_WORLD, &q);
      }
      pending.push_back(q);
    }
  };
  part.wait = [&] {
    MPI_Waitall(int(pending.size()), pending.data(), MPI_STATUSES_IGNORE);
    pending.clear();
  };
  const ExecSpace exec;
  nn::ParamStore<double> store;
  nn::Gpt<double> gpt(store, shape, part);
  store.allocate();
  store.initialize(exec, 3);
  store.zero_grads(exec);
  const int n = shape.context / C;
  std::vector<double> tokens;
  std::vector<std::int32_t> labels;
  for (int i = 0; i < batch * n; ++i) {
    tokens.push_back(i % shape.vocab);
    labels.push_back((3 * i + 1) % shape.vocab);
  }
  gpt.reserve(batch);
  const int slot = gpt.acquire(batch);
  Kokkos::deep_copy(gpt.input(slot), to_device(tokens, std::size_t(batch), std::size_t(n)));
  gpt.forward(exec, slot);
  gpt.loss(exec, slot, to_device(labels), MatrixU<const double>(), 0.5);
  gpt.backward(exec, slot);
  return to;
}

}  // namespace

TEST(ContextMessages, EveryFormHandsEachRankWhatTheFormulaSays) {
  const int C = tessera::test::world_size(), r = tessera::test::world_rank(), batch = 2;
  // Context 32: blocks of 8 positions on 4 ranks, 16 on 2; windows within one block, across one
  // block boundary, across two, and as long as the context.
  std::vector<Form> forms = {{ContextComm::all_to_all, 0, false}, {ContextComm::all_to_all, 0, true},
                             {ContextComm::ring, 0, false}, {ContextComm::ring, 0, true}};
  for (int window : {3, 9, 12, 20, 32}) forms.push_back({ContextComm::ring, window, window == 12});
  for (const Form& form : forms)
    for (bool recompute : {false, true}) {
      SCOPED_TRACE(testing::Message() << (form.comm == ContextComm::ring ? "ring" : "all_to_all") << ", window "
                                      << form.window << (form.llama ? ", llama" : ", gpt") << ", recompute "
                                      << recompute << ", rank " << r);
      nn::GptShape shape{8, 32, 16, 4, 2};  // vocab 8, context 32, width 16, 4 heads of 4, 2 blocks
      shape.window = form.window;
      if (form.llama) {
        shape.llama = true;
        shape.kv_heads = 2;
        shape.ffn = 24;
        shape.tied = false;
      }
      Config cfg;
      cfg.model.kind = form.llama ? ModelKind::llama : ModelKind::gpt;
      cfg.model.layers = shape.layers;
      cfg.model.heads = shape.heads;
      cfg.model.kv_heads = shape.kv_heads;
      cfg.model.width = shape.width;
      cfg.model.context = shape.context;
      cfg.model.window = form.window;
      cfg.parallel.data = cfg.parallel.tensor = cfg.parallel.pipeline = 1;
      cfg.parallel.spatial = C;
      cfg.parallel.context_comm = form.comm;
      cfg.train.global_batch = batch;
      cfg.train.recompute = recompute;
      const ContextTraffic t = context_traffic(cfg, ModelShape{}, 0);
      const std::vector<double> got = handed(form, recompute, shape, batch);
      if (C == 1) {
        EXPECT_EQ(t.ranks, 1);
        EXPECT_EQ(got[0], 0.0);
        continue;
      }
      ASSERT_EQ(t.ranks, C);
      for (int q = 0; q < C; ++q) EXPECT_EQ(got[static_cast<std::size_t>(q)], t.between(r, q)) << "to rank " << q;
    }
}
