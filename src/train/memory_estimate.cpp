#include "train/memory_estimate.hpp"

#include <algorithm>
#include <cmath>
#include <functional>
#include <optional>
#include <vector>

#include <fmt/format.h>

#include "blas/gemm.hpp"
#include "core/error.hpp"
#include "core/memory.hpp"
#include "optim/optimizer.hpp"
#include "train/pipeline.hpp"
#include "train/sharding.hpp"
#include "train/trainer.hpp"

namespace tessera {

BatchRows batch_rows(const Config& cfg, std::int64_t train_samples, std::int64_t test_samples) {
  const std::int64_t parts = static_cast<std::int64_t>(cfg.parallel.data) * cfg.parallel.micro_batches;
  const std::int64_t global = std::min<std::int64_t>(cfg.train.global_batch, std::max<std::int64_t>(1, train_samples));
  BatchRows r;
  r.micro = (global + parts - 1) / parts;
  if (test_samples > 0) {
    const std::int64_t share = (test_samples + cfg.parallel.data - 1) / cfg.parallel.data;
    r.eval = std::max<std::int64_t>(1, std::min<std::int64_t>(cfg.eval.batch, share));
  }
  return r;
}

namespace {

// The activations of the most loaded pipeline stage: each network of the stage (one per chunk,
// tensor rank 0's part) says what its slots of `rows` rows and its working set take. A chunk
// keeps the slots it ever held live at once (they are reused, never freed): at most the
// schedule's bound on the stage's live slots (slot_bound, what the executor keeps to), and over
// several chunks also at most one per micro-batch of a step (its slots all retire by the step's
// end).
double activation_bytes(const Config& cfg, const ModelShape& shape, int rows) {
  const int stages = cfg.parallel.pipeline, micro = cfg.parallel.micro_batches;
  const std::vector<int> bounds = stage_bounds(cfg, shape);
  double most = 0;
  for (int stage = 0; stage < stages; ++stage) {
    ModelPart part;
    part.chunks = stage_chunks(cfg, bounds, stage);
    part.tp = cfg.parallel.tensor;
    part.tensor_sum = [](float*, std::size_t) {};  // registration only: never called
    if (is_transformer(cfg.model.kind) && cfg.parallel.spatial > 1) {  // a block of each sequence
      part.sp = cfg.parallel.spatial;
      part.all_to_all = [](const float*, float*, std::size_t) {};
      part.spatial_sum = [](double*, std::size_t) {};
      part.ring = cfg.parallel.context_comm == ContextComm::ring;
      part.messages = [](std::span<const nn::ContextMessage<float>>) {};
      part.wait = [] {};
    }
    const int chunks = static_cast<int>(part.chunks.size());
    const int bound = slot_bound(pipeline_schedule(cfg.parallel.schedule, stages, stage, micro, chunks), chunks);
    const int slots = chunks > 1 ? std::min(bound, micro) : bound;
    nn::ParamStore<float> store;
    double bytes = 0;
    for (std::size_t c = 0; c < part.chunks.size(); ++c)
      bytes += make_network(store, cfg, shape, part, c)->activation_bytes(rows, slots);
    most = std::max(most, bytes);
  }
  return most;
}

}  // namespace

MemoryEstimate estimate_memory(const Config& cfg, const ModelShape& shape, const BatchRows& batch) {
  const int zero = cfg.parallel.zero;
  const ParamLayout layout = Sharding::layout(cfg, cfg.parallel.data * cfg.parallel.spatial);
  const int states = cfg.optimizer.kind == OptimizerKind::adamw ? 2 : (cfg.optimizer.momentum > 0 ? 1 : 0);
  MemoryEstimate e;
  {
    nn::ParamStore<float> whole;  // the whole model: its parameter count
    make_network(whole, cfg, shape);
    e.parameter_count = whole.parameter_count();
  }
  // The parameters, gradients and optimizer state of the most loaded rank: tensor rank 0's part
  // of each pipeline stage (all its chunks over one store), planned into buckets and shards as a
  // run plans them.
  const std::vector<int> bounds = stage_bounds(cfg, shape);
  double most = -1, shard_elements = 0;
  for (int stage = 0; stage < cfg.parallel.pipeline; ++stage) {
    ModelPart part;
    part.chunks = stage_chunks(cfg, bounds, stage);
    part.tp = cfg.parallel.tensor;
    part.tensor_sum = [](float*, std::size_t) {};  // registration only: never called
    nn::ParamStore<float> store;
    for (std::size_t c = 0; c < part.chunks.size(); ++c) make_network(store, cfg, shape, part, c);
    store.plan(layout.shards, layout.bucket_elements);
    std::size_t largest = 0;
    for (const auto& b : store.buckets()) largest = std::max(largest, b.length);
    const auto full = static_cast<double>(store.size()), shard = static_cast<double>(store.shard_size()),
               bucket = static_cast<double>(largest);
    // The optimizer state's elements on this rank: its shard from zero 1 on.
    const std::size_t state_elements = zero >= 1 ? store.shard_size() : store.size();
    MemoryEstimate s;
    // zero 3 holds its shard and one gathered bucket (optimizer.offload_values: the shard on disk,
    // and in memory a bucket's chunk read from it and the file's buffer); zero 2 its gradient shard
    // and the buckets between backward and the end of their exchange (about two); zero 1 both
    // gradient buffers.
    const bool values_on_disk = zero >= 3 && cfg.optimizer.offload_values;
    // (alone in its group a rank reads the bucket straight into its gathered buffer)
    const double chunk = layout.shards > 1 ? std::ceil(bucket / static_cast<double>(layout.shards)) : 0.0;
    // A transformer whose head is its token embedding holds the embedding's bucket (the first)
    // gathered again beside the last block's while the head computes.
    const bool tied_head = is_transformer(cfg.model.kind) && cfg.parallel.pipeline == 1 &&
                           (cfg.model.kind == ModelKind::gpt || cfg.model.tie_embeddings) &&
                           store.buckets().size() > 1;
    // parallel.zero_prefetch: one more bucket gathered (and read, through its own buffer) ahead of its use.
    const bool ahead = Sharding::gathers_ahead(cfg, layout.shards);
    const double held = bucket + (zero >= 3 && tied_head ? static_cast<double>(store.buckets().front().length) : 0.0) +
                        (ahead ? bucket : 0.0);
    const double value_buffers = static_cast<double>(Sharding::kValueBuffer) * (ahead ? 2.0 : 1.0);
    s.parameters = 4.0 * (values_on_disk ? held + chunk + value_buffers
                          : zero >= 3    ? shard + held  // the gathered buffers beside the shard, even alone
                                         : full);
    // Products in bf16 read the weights' bf16 copies (nn::bf16_weights: a float store with full
    // values and a bf16 GEMM; the U-Net's convolutions read none): 2 bytes for each element of the
    // store, made at the first product and kept.
    if (cfg.model.kind != ModelKind::unet && layout.storage.full_values && blas::bf16_operands(cfg.train.precision))
      s.parameters += mem::view_bytes(full, 2.0);
    s.gradients = 4.0 * (zero >= 2 ? (Sharding::grads_in_shard(cfg, layout.shards) ? shard
                                                                                  : std::min(full + shard, shard + 2 * bucket))
                         : zero == 1 ? full + shard
                                     : full);
    s.optimizer = 4.0 * states * static_cast<double>(state_elements);
    const bool disk = cfg.optimizer.offload == OptimizerOffload::disk && states > 0;
    const bool staged = offload_staged(cfg.optimizer);
    if (disk || staged || values_on_disk) {
      // The optimizer's own rule: the state on disk (memory holds its tiles) or in host memory, the
      // values on disk streamed beside it, and where the parameters are not in host memory, their
      // staged tiles.
      const OffloadPlan plan =
          offload_plan(cfg.optimizer, static_cast<std::size_t>(states), state_elements, staged, values_on_disk);
      s.offload_disk = 4.0 * ((disk ? states : 0) + (values_on_disk ? 1 : 0)) * static_cast<double>(plan.padded);
      s.optimizer = plan.buffer_bytes() + (disk ? 0.0 : 4.0 * states * static_cast<double>(state_elements));
      if (!Kokkos::SpaceAccessibility<HostSpace, MemSpace>::accessible) {
        s.offload_host = s.optimizer;  // beside the device's memory
        s.optimizer = 0;
      }
    }
    // checkpoint.async: each save stages a host copy of the values and the optimizer state this
    // rank holds (Checkpointer::begin_save), wherever they live (memory, a device, the offload
    // files). A synchronous save reads them a tensor at a time into one host buffer
    // (io::materialized), the largest tensor's (a parameter's, or its piece of the shard).
    std::size_t largest_param = 0;
    for (const auto& info : store.infos()) largest_param = std::max(largest_param, info.size);
    const double copy = cfg.checkpoint.async
                            ? 4.0 * ((zero >= 3 ? shard : full) + states * static_cast<double>(state_elements))
                            : 4.0 * static_cast<double>(largest_param);
    if (Kokkos::SpaceAccessibility<HostSpace, MemSpace>::accessible) s.checkpoint = copy;
    else s.offload_host += copy;
    const double total = s.parameters + s.gradients + s.optimizer + s.offload_host + s.checkpoint;
    if (total <= most) continue;
    most = total;
    e.buckets = store.buckets().size();
    e.parameters = s.parameters;
    e.gradients = s.gradients;
    e.optimizer = s.optimizer;
    e.offload_disk = s.offload_disk;
    e.offload_host = s.offload_host;
    e.checkpoint = s.checkpoint;
    shard_elements = shard;
  }
  e.comm = Sharding::accumulates_into_shard(cfg) ? 4.0 * shard_elements : 0.0;

  e.micro_batch = batch.micro > 0 ? batch.micro : micro_batch_rows(cfg);
  e.eval_batch = batch.micro > 0 ? batch.eval : cfg.eval.batch;
  const auto rows = static_cast<double>(std::max<std::int64_t>(e.micro_batch, e.eval_batch));
  e.activations = activation_bytes(cfg, shape, static_cast<int>(rows));
  e.data = 4.0 * static_cast<double>(e.micro_batch) * static_cast<double>(shape.in_features);
  if (cfg.model.kind == ModelKind::unet) {
    // The batch staged holds this rank's block of inputs and targets.
    e.data = 4.0 * static_cast<double>(e.micro_batch) * static_cast<double>(shape.in_features + shape.outputs) /
             cfg.parallel.spatial;
  }
  return e;
}

namespace {

// What to change where a run needs more memory than it may have (`room`: the bytes per rank it
// may have). Where moving the optimizer state to disk alone would fit, that first.
std::string memory_hint(const Config& cfg, const MemoryEstimate& e, double room,
                        const std::function<MemoryEstimate(const Config&)>& estimate_for) {
  const double buffer = cfg.optimizer.offload_buffer_mb * 1e6;
  // The estimate with the deck changed by `change`, where that fits the room.
  const auto fits_with = [&](const std::function<void(Config&)>& change) -> std::optional<MemoryEstimate> {
    if (!estimate_for) return std::nullopt;
    Config c = cfg;
    change(c);
    const MemoryEstimate d = estimate_for(c);
    if (d.total() > room) return std::nullopt;
    return d;
  };
  if (cfg.checkpoint.async)
    if (const auto d = fits_with([](Config& c) { c.checkpoint.async = false; }))
      return fmt::format("set checkpoint.async = false (about {:.1f} MB per rank then; an asynchronous save stages a "
                         "host copy of the rank's parameters and optimizer state, {:.1f} MB, while it writes)",
                         d->total() / 1e6, e.checkpoint / 1e6);
  // ZeRO 3's bucket gathered ahead of its use.
  if (Sharding::gathers_ahead(cfg, cfg.parallel.data * cfg.parallel.spatial))
    if (const auto d = fits_with([](Config& c) { c.parallel.zero_prefetch = false; }))
      return fmt::format("set parallel.zero_prefetch = false (about {:.1f} MB per rank then; gathering the next "
                         "bucket while one computes holds one more, {:.1f} MB)",
                         d->total() / 1e6, (e.total() - d->total()) / 1e6);
  // A GPU build: the state in host memory takes it off the device (the staging stays in host memory too).
  if (!Kokkos::SpaceAccessibility<HostSpace, MemSpace>::accessible && cfg.optimizer.offload == OptimizerOffload::none &&
      e.optimizer > 0 && e.total() - e.optimizer <= room)
    return fmt::format("set optimizer.offload = \"host\" (about {:.1f} MB per rank on the device then; the {:.1f} MB "
                       "of optimizer state per rank go to host memory)",
                       (e.total() - e.optimizer) / 1e6, e.optimizer / 1e6);
  if (cfg.optimizer.offload == OptimizerOffload::none && e.optimizer > buffer &&
      e.total() - e.optimizer + buffer <= room)
    return fmt::format("set optimizer.offload = \"disk\" (about {:.1f} MB per rank then; the {:.1f} MB of optimizer "
                       "state per rank go to node-local disk under optimizer.offload_path)",
                       (e.total() - e.optimizer + buffer) / 1e6, e.optimizer / 1e6);
  // The values on disk too: only the gradients, the activations and a few buckets stay (and, where
  // only that fits, no bucket gathered ahead).
  if (!cfg.optimizer.offload_values && !cfg.comm.priority && Kokkos::SpaceAccessibility<HostSpace, MemSpace>::accessible) {
    const auto on_disk = [](Config& c) {
      c.optimizer.offload = OptimizerOffload::disk;
      c.optimizer.offload_values = true;
      c.parallel.zero = 3;
    };
    std::string also = cfg.parallel.zero == 3 ? "" : " and parallel.zero = 3";
    auto d = fits_with(on_disk);
    if (!d && cfg.parallel.zero_prefetch) {
      d = fits_with([&](Config& c) {
        on_disk(c);
        c.parallel.zero_prefetch = false;
      });
      also = cfg.parallel.zero == 3 ? " and parallel.zero_prefetch = false" : ", parallel.zero = 3 and parallel.zero_prefetch = false";
    }
    if (d)
      return fmt::format("set optimizer.offload = \"disk\", optimizer.offload_values = true{} (about {:.1f} MB per "
                         "rank then; the optimizer state and the parameter values, {:.1f} MB per rank, go to "
                         "node-local disk under optimizer.offload_path)",
                         also, d->total() / 1e6, d->offload_disk / 1e6);
  }
  const bool acts = e.activations >= e.parameters + e.gradients + e.optimizer;
  if (acts && cfg.model.kind == ModelKind::unet)
    return "split each sample's fields over more ranks (parallel.spatial), or lower train.global_batch, eval.batch "
           "or model.channels";
  if (acts && is_transformer(cfg.model.kind))
    return "split each sequence over more ranks (parallel.spatial; parallel.context_comm = \"ring\" keeps no "
           "T x T scores), or lower train.global_batch, eval.batch or the model's widths, or add "
           "parallel.micro_batches";
  return acts ? "lower train.global_batch, eval.batch or the model's widths, or add parallel.micro_batches or ranks"
              : "lower the model's widths, or shard it (parallel.tensor, parallel.pipeline, parallel.zero)";
}

}  // namespace

void check_memory_limit(const Config& cfg, const Communicator& comm) {
  const double limit = cfg.run.memory_limit_mb * 1e6;
  if (limit <= 0 || !mem::tracking_installed()) return;
  std::vector<double> all(static_cast<std::size_t>(comm.size()), 0.0);
  all[static_cast<std::size_t>(comm.rank())] = static_cast<double>(mem::peak_total());
  comm.allreduce_max(all.data(), all.size(), Group::world);
  const auto worst = std::max_element(all.begin(), all.end());
  if (*worst <= limit) return;
  throw InputError(fmt::format(
      "run.memory_limit_mb = {}: rank {} held {:.1f} MB at its peak in the first step (measured: every "
      "allocation the program counts), more than the limit; the run stopped before writing anything. {}",
      cfg.run.memory_limit_mb, worst - all.begin(), *worst / 1e6,
      cfg.model.kind == ModelKind::unet ? "Split each sample's fields over more ranks (parallel.spatial) or lower "
                                          "train.global_batch"
                                        : "Lower train.global_batch or the model's widths, or add ranks"));
}

void check_memory(const Config& cfg, const MemoryEstimate& e, int ranks_on_node,
                  const std::function<MemoryEstimate(const Config&)>& estimate_for) {
  if (cfg.run.memory_limit_mb > 0 && e.total() > cfg.run.memory_limit_mb * 1e6)
    throw InputError(fmt::format(
        "run.memory_limit_mb = {}: the run needs about {:.1f} MB per rank (estimate: parameters {:.1f}, gradients "
        "{:.1f}, optimizer state {:.1f}, activations {:.1f}, input batch {:.1f}{} MB), more than the limit; {}",
        cfg.run.memory_limit_mb, e.total() / 1e6, e.parameters / 1e6, e.gradients / 1e6, e.optimizer / 1e6,
        e.activations / 1e6, e.data / 1e6,
        e.checkpoint > 0 ? fmt::format(", checkpoint {} {:.1f}", cfg.checkpoint.async ? "staging" : "buffer",
                                       e.checkpoint / 1e6)
                         : std::string(),
        memory_hint(cfg, e, cfg.run.memory_limit_mb * 1e6, estimate_for)));
  const mem::NodeMemory node = mem::node_memory();
  const double need = e.total() * ranks_on_node;
  if (node.bytes <= 0 || need <= node.bytes) return;
  throw InputError(fmt::format(
      "the run needs about {:.3g} GB per rank (estimate: parameters {:.3g}, gradients {:.3g}, optimizer "
      "state {:.3g}, activations {:.3g} GB), {:.3g} GB for the {} rank(s) on this node, more than its "
      "{:.3g} GB ({}); {}", e.total() / 1e9, e.parameters / 1e9, e.gradients / 1e9, e.optimizer / 1e9,
      e.activations / 1e9, need / 1e9, ranks_on_node, node.bytes / 1e9, node.source,
      memory_hint(cfg, e, node.bytes / ranks_on_node, estimate_for)));
}

}  // namespace tessera
