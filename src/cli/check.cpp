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
#include "io/dataset.hpp"
#include "nn/attention.hpp"
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

void print_estimate(const Config& cfg, const ModelShape& shape, std::int64_t train_samples, int dp) {
  // The model's real parameter layout (registered, not allocated): buckets and shards as a run
  // would plan them.
  nn::ParamStore<float> store;
  make_network(store, cfg, shape);
  const int zero = cfg.parallel.zero;
  store.plan(zero >= 1 ? dp : 1, DataParallel::bucket_elements(cfg));
  std::size_t largest = 0;
  for (const auto& b : store.buckets()) largest = std::max(largest, b.length);
  const auto full = static_cast<double>(store.size()), shard = static_cast<double>(store.shard_size()),
             bucket = static_cast<double>(largest);
  const int states = cfg.optimizer.kind == OptimizerKind::adamw ? 2 : (cfg.optimizer.momentum > 0 ? 1 : 0);
  // zero 3 holds its shard and one gathered bucket; zero 2 its gradient shard and the buckets
  // between backward and the end of their exchange (about two); zero 1 both gradient buffers.
  const double p = 4.0 * (zero >= 3 ? std::min(full, shard + bucket) : full);
  const double g = 4.0 * (zero >= 2 ? std::min(full + shard, shard + 2 * bucket) : zero == 1 ? full + shard : full);
  const double o = 4.0 * states * (zero >= 1 ? shard : full);
  const bool accumulate = zero >= 1 && cfg.parallel.micro_batches > 1 && (zero >= 2 || !cfg.comm.no_sync);
  const double c = accumulate ? 4.0 * shard : 0.0;

  const std::int64_t micro = micro_batch_rows(cfg);
  const std::int64_t rows = std::max<std::int64_t>(micro, cfg.eval.batch);
  std::int64_t act = 0;
  if (cfg.model.kind == ModelKind::gpt) {
    // Per token of a micro-batch in flight, per block: ln_1, x1, ln_2 and the block's output (C
    // each), qkv (3C/tp), y (C/tp), fc and gelu (4C/tp each), the attention probabilities
    // (heads/tp x T; heads/tp where a GPU build runs the fused attention), four row statistics;
    // the head's logits and their gradient (2V/tp) and
    // ln_f. Recomputation keeps the block outputs only, plus one block's set shared by all.
    const std::int64_t C = cfg.model.width, T = cfg.model.context, tp = cfg.parallel.tensor;
    const std::int64_t L = cfg.model.layers / cfg.parallel.pipeline + (cfg.model.layers % cfg.parallel.pipeline ? 1 : 0);
    const auto scores = static_cast<std::int64_t>(nn::attention_scores_width(static_cast<std::size_t>(T)));
    const std::int64_t block = 3 * C + 12 * C / tp + cfg.model.heads / tp * scores + 4;
    const std::int64_t per_token = cfg.train.recompute ? L * C : L * (block + C);
    const std::int64_t tokens = rows * T;
    act = tokens * (per_token + 2 * shape.outputs / tp + C) + (cfg.train.recompute ? tokens * block : 0);
  } else {
    // Each hidden layer keeps its output before and after the activation and its gradient; the
    // output layer its logits and their gradient; the input batch is staged once.
    for (int h : cfg.model.hidden) act += 3 * static_cast<std::int64_t>(h);
    act = rows * (act + 2 * shape.outputs);
  }
  const double a = 4.0 * static_cast<double>(act), d = 4.0 * static_cast<double>(micro * shape.in_features);
  std::cout << fmt::format("model: {}, {} parameters in {} bucket(s); {} steps per epoch\n",
                           describe_model(cfg, shape), store.parameter_count(), store.buckets().size(),
                           Sampler(train_samples, cfg.run.seed, cfg.train.global_batch, cfg.train.drop_last)
                               .batches_per_epoch());
  std::cout << fmt::format("memory per rank (estimate, ZeRO stage {}): parameters {}, gradients {}, "
                           "optimizer state {}, activations {} (micro-batch {}, eval batch {}), comm "
                           "buffers {}, input batch {}, total {}\n",
                           zero, megabytes(p), megabytes(g), megabytes(o), megabytes(a), micro,
                           cfg.eval.batch, megabytes(c), megabytes(d), megabytes(p + g + o + a + c + d));
}

}  // namespace

int check(const DeckArgs& args, int ranks) {
  const int rank = world_rank();
  const int n = ranks > 0 ? ranks : world_size();
  const Config cfg = load_config(args, n);
  // The data: rank 0 opens it alone (the grid being checked need not be this run's).
  agree(MPI_COMM_WORLD, [&] {
    if (rank != 0) return;
    {
      const auto split = io::open_split(MPI_COMM_SELF, cfg.data.path, cfg.data.train_split,
                                        cfg.model.context, false);
      const io::Split& train = *split;
      const ModelShape shape = model_shape(cfg, train.info());
      std::cout << "# resolved deck\n" << cfg.resolved_toml << "\n";
      print_groups(cfg, n);
      std::cout << fmt::format("data: {} /{}: {} samples of {} features, {}\n", cfg.data.path,
                               cfg.data.train_split, train.info().samples, train.info().features,
                               shape.classification ? fmt::format("{} classes", shape.outputs)
                                                    : fmt::format("{} targets", shape.outputs));
      print_estimate(cfg, shape, train.info().samples, cfg.parallel.data);
      std::cout << fmt::format("deck {} is valid for {} ranks\n", cfg.deck_path, n);
    }
  });
  return 0;
}

}  // namespace tessera::cli
