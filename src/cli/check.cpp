// tessera check: validate a deck without training; print it resolved, the process grid and a
// per-rank memory estimate.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <mpi.h>

#include <algorithm>
#include <iostream>

#include "cli/commands.hpp"
#include "comm/agree.hpp"
#include "comm/communicator.hpp"
#include "core/error.hpp"
#include "core/memory.hpp"
#include "io/dataset.hpp"
#include "train/memory_estimate.hpp"
#include "train/sampler.hpp"
#include "train/trainer.hpp"

namespace tessera::cli {

namespace {

std::string megabytes(double bytes) { return fmt::format("{:.2f} MB", bytes / 1e6); }

// Which world ranks form each group of the grid rank = t + tp*(d + dp*p).
void print_groups(const Config& cfg, int ranks) {
  const int dp = cfg.parallel.data, tp = cfg.parallel.tensor, pp = cfg.parallel.pipeline;
  auto rank_of = [&](int d, int t, int p) { return t + tp * (d + dp * p); };
  std::cout << fmt::format("layout: data {} x tensor {} x pipeline {} = {} ranks, micro-batches {}, zero {}\n",
                           dp, tp, pp, ranks, cfg.parallel.micro_batches, cfg.parallel.zero);
  for (int p = 0; p < pp; ++p)
    for (int t = 0; t < tp; ++t) {
      std::vector<int> g;
      for (int d = 0; d < dp; ++d) g.push_back(rank_of(d, t, p));
      std::cout << fmt::format("  data group (t={},p={}): ranks [{}]\n", t, p, fmt::join(g, ","));
    }
  for (int p = 0; p < pp; ++p)
    for (int d = 0; d < dp; ++d) {
      std::vector<int> g;
      for (int t = 0; t < tp; ++t) g.push_back(rank_of(d, t, p));
      std::cout << fmt::format("  tensor group (d={},p={}): ranks [{}]\n", d, p, fmt::join(g, ","));
    }
  for (int d = 0; d < dp; ++d)
    for (int t = 0; t < tp; ++t) {
      std::vector<int> g;
      for (int p = 0; p < pp; ++p) g.push_back(rank_of(d, t, p));
      std::cout << fmt::format("  pipeline group (d={},t={}): ranks [{}]\n", d, t, fmt::join(g, ","));
    }
}

void print_estimate(const Config& cfg, const ModelShape& shape, const MemoryEstimate& e,
                    std::int64_t train_samples) {
  std::cout << fmt::format("model: {}, {} parameters in {} bucket(s); {} steps per epoch\n",
                           describe_model(cfg, shape), e.parameter_count, e.buckets,
                           Sampler(train_samples, cfg.run.seed, cfg.train.global_batch, cfg.train.drop_last)
                               .batches_per_epoch());
  std::cout << fmt::format("memory per rank (estimate, ZeRO stage {}): parameters {}, gradients {}, "
                           "optimizer state {}, activations {} (micro-batch {}, eval batch {}), comm "
                           "buffers {}, input batch {}, total {}\n",
                           cfg.parallel.zero, megabytes(e.parameters), megabytes(e.gradients),
                           megabytes(e.optimizer), megabytes(e.activations), e.micro_batch,
                           e.eval_batch, megabytes(e.comm), megabytes(e.data), megabytes(e.total()));
  const mem::NodeMemory node = mem::node_memory();
  std::cout << fmt::format("this node: {:.2f} GB ({}); the estimate per rank must fit the node's memory "
                           "shared by its ranks\n", node.bytes / 1e9, node.source);
}

}  // namespace

int check(const DeckArgs& args, int ranks) {
  const int rank = world_rank();
  const int n = ranks > 0 ? ranks : world_size();
  const Config cfg = load_config(args, n);
  // The data: rank 0 opens it alone (the grid being checked need not be this run's). Everything
  // is checked before anything is printed.
  agree(MPI_COMM_WORLD, [&] {
    if (rank != 0) return;
    const auto train = io::open_split(MPI_COMM_SELF, cfg.data.path, cfg.data.train_split,
                                      cfg.model.context, false);
    const io::SplitInfo& info = train->info();
    const ModelShape shape = model_shape(cfg, info);
    const std::int64_t test_samples =
        eval_enabled(cfg.eval) ? io::open_split(MPI_COMM_SELF, cfg.data.path, cfg.data.test_split,
                                                cfg.model.context, false)->info().samples
                               : 0;
    const MemoryEstimate estimate = estimate_memory(cfg, shape, batch_rows(cfg, info.samples, test_samples));
    check_memory(cfg, estimate, 1);

    std::cout << "# resolved deck\n" << cfg.resolved_toml << "\n";
    print_groups(cfg, n);
    std::cout << fmt::format("data: {} /{}: {} samples of {} features, {}\n", cfg.data.path,
                             cfg.data.train_split, info.samples, info.features,
                             shape.classification ? fmt::format("{} classes", shape.outputs)
                                                  : fmt::format("{} targets", shape.outputs));
    for (const std::string& warning : cfg.warnings) std::cout << "warning: " << warning << "\n";
    print_estimate(cfg, shape, estimate, info.samples);
    std::cout << fmt::format("deck {} is valid for {} ranks\n", cfg.deck_path, n);
  });
  return 0;
}

}  // namespace tessera::cli
