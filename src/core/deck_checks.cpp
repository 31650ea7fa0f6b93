// Checks across keys: those known from the deck alone, and those that need the world size.
#include "core/deck_checks.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <initializer_list>

#include "core/build_features.hpp"
#include "core/deck.hpp"
#include "core/error.hpp"

namespace tessera {
namespace deck {
namespace {

/// Where to point for a problem with `keys`: the first of them the deck or --set gave a value.
std::string where_of(const Config& cfg, const Origins& origins, std::initializer_list<const char*> keys) {
  for (const char* k : keys)
    if (auto it = origins.find(k); it != origins.end()) return it->second;
  return cfg.deck_path;
}

[[noreturn]] void fail(const std::string& where, std::string_view key, const std::string& what) {
  throw InputError(fmt::format("{}: {}: {}", where, key, what));
}

// comm.priority defers each bucket's update to the next step's forward: nothing may need every
// bucket's gradient before the first update (clipping, fp16's skip) or its shard (ZeRO).
void check_priority(const Config& cfg, const Origins& origins) {
  const auto refuse = [&](std::initializer_list<const char*> keys, const std::string& what) {
    fail(where_of(cfg, origins, keys), "comm.priority", what + " (or set comm.priority = false)");
  };
  if (cfg.optimizer.clip_grad_norm > 0.0)
    refuse({"comm.priority", "optimizer.clip_grad_norm"},
           "true updates each bucket as its exchange ends, but optimizer.clip_grad_norm > 0 needs the "
           "global norm first; set optimizer.clip_grad_norm = 0");
  if (cfg.train.precision == Precision::fp16)
    refuse({"comm.priority", "train.precision"},
           "true updates each bucket as its exchange ends, but train.precision = \"fp16\" may skip the "
           "whole step; use \"bf16\" or \"fp32\"");
  if (cfg.parallel.zero != 0)
    refuse({"comm.priority", "parallel.zero"}, "true supports parallel.zero = 0 only");
  if (cfg.parallel.pipeline != 1)
    refuse({"comm.priority", "parallel.pipeline"}, "true supports parallel.pipeline = 1 only");
  if (cfg.parallel.micro_batches > 1 && !cfg.comm.no_sync)
    refuse({"comm.priority", "comm.no_sync"}, "true with micro_batches > 1 needs comm.no_sync = true");
  if (cfg.comm.allreduce != AllreduceAlgorithm::mpi)
    refuse({"comm.priority", "comm.allreduce"},
           "true sends pieces with MPI's nonblocking allreduce; set comm.allreduce = \"mpi\"");
  if (cfg.optimizer.offload == OptimizerOffload::disk)
    refuse({"comm.priority", "optimizer.offload"},
           "true updates bucket by bucket inside the next step's forward, which optimizer.offload = \"disk\" "
           "does not stream yet; set optimizer.offload = \"none\" or \"host\"");
}

}  // namespace

void check_combinations(Config& cfg, const Origins& origins) {
  const auto o = cfg.optimizer;
  const auto s = cfg.schedule;
  const auto t = cfg.train;

  if (o.nesterov && o.momentum == 0.0)
    fail(where_of(cfg, origins, {"optimizer.nesterov", "optimizer.momentum"}), "optimizer.nesterov",
         "nesterov = true needs momentum, but optimizer.momentum = 0; "
         "set optimizer.momentum > 0 (e.g. 0.9) or optimizer.nesterov = false");

  if ((s.kind == ScheduleKind::cosine || s.kind == ScheduleKind::cosine_restarts) && s.min_lr > o.lr)
    fail(where_of(cfg, origins, {"schedule.min_lr", "optimizer.lr", "schedule.kind"}), "schedule.min_lr",
         fmt::format("schedule.min_lr = {} is above optimizer.lr = {} with schedule.kind = \"{}\"; "
                     "allowed: schedule.min_lr <= optimizer.lr",
                     s.min_lr, o.lr, to_string(s.kind)));

  if (t.steps > 0 && s.warmup_steps >= t.steps)
    cfg.warnings.push_back(fmt::format(
        "{}: schedule.warmup_steps = {} is not below train.steps = {}: the learning rate rises "
        "linearly for the whole run and ends at {:.3g} of optimizer.lr = {}{}",
        where_of(cfg, origins, {"schedule.warmup_steps", "train.steps"}), s.warmup_steps, t.steps,
        static_cast<double>(t.steps) / static_cast<double>(s.warmup_steps), o.lr,
        s.kind == ScheduleKind::constant ? "" : fmt::format("; the {} schedule never starts", to_string(s.kind))));

  if (t.steps == 0 && t.epochs == 0)
    fail(where_of(cfg, origins, {"train.epochs", "train.steps"}), "train.epochs",
         "train.epochs = 0 and train.steps = 0 leave nothing to train; "
         "allowed: train.epochs >= 1, or train.steps >= 1");

  if (cfg.run.gemm == GemmLibrary::onednn && !build::onednn)
    fail(where_of(cfg, origins, {"run.gemm"}), "run.gemm",
         "\"onednn\" needs a build with oneDNN, and this one has none (configured with "
         "-DTESSERA_ENABLE_ONEDNN=OFF); allowed here: \"auto\", \"openblas\"");

  if (cfg.run.conv == ConvLibrary::onednn && !build::onednn)
    fail(where_of(cfg, origins, {"run.conv"}), "run.conv",
         "\"onednn\" needs a build with oneDNN, and this one has none (configured with "
         "-DTESSERA_ENABLE_ONEDNN=OFF); allowed here: \"auto\", \"im2col\"");

  if (o.offload_values && o.offload != OptimizerOffload::disk)
    fail(where_of(cfg, origins, {"optimizer.offload_values", "optimizer.offload"}), "optimizer.offload_values",
         fmt::format("true puts the parameter values in the offload file, but optimizer.offload = \"{}\" makes "
                     "none; set optimizer.offload = \"disk\"",
                     to_string(o.offload)));
  if (o.offload_values && cfg.parallel.zero != 3)
    fail(where_of(cfg, origins, {"optimizer.offload_values", "parallel.zero"}), "optimizer.offload_values",
         fmt::format("true keeps only the values of the bucket being computed in memory, which needs the values "
                     "gathered per bucket, but parallel.zero = {} holds them all; set parallel.zero = 3",
                     cfg.parallel.zero));

  if (cfg.parallel.zero_group == ZeroGroup::node && cfg.parallel.zero == 0)
    fail(where_of(cfg, origins, {"parallel.zero_group", "parallel.zero"}), "parallel.zero_group",
         "\"node\" shards the training state within each node, but parallel.zero = 0 shards nothing; "
         "set parallel.zero >= 1, or parallel.zero_group = \"data\"");

  const auto& c = cfg.comm;
  if (c.backend == CommBackend::nccl && !build::nccl)
    fail(where_of(cfg, origins, {"comm.backend"}), "comm.backend",
         "\"nccl\" needs a build with NCCL, and this one has none (configured without "
         "-DTESSERA_ENABLE_CUDA=ON, or CMake found no nccl.h/libnccl); allowed here: \"auto\", "
         "\"mpi\", \"cuda-aware-mpi\", \"staged\"");
  if (c.backend == CommBackend::nccl && c.allreduce != AllreduceAlgorithm::mpi)
    fail(where_of(cfg, origins, {"comm.allreduce", "comm.backend"}), "comm.allreduce",
         fmt::format("\"{}\" with comm.backend = \"nccl\": NCCL runs its own "
                     "allreduce; set comm.allreduce = \"mpi\" (the library's own), or "
                     "comm.backend = \"staged\" to run \"{}\" on host copies",
                     to_string(c.allreduce), to_string(c.allreduce)));
  if (c.backend == CommBackend::nccl && c.reduce_dtype != ReduceDtype::fp32)
    fail(where_of(cfg, origins, {"comm.reduce_dtype", "comm.backend"}), "comm.reduce_dtype",
         fmt::format("\"{}\" with comm.backend = \"nccl\": the conversion runs on the host; set "
                     "comm.reduce_dtype = \"fp32\", or comm.backend = \"staged\"",
                     to_string(c.reduce_dtype)));
  if (c.priority) check_priority(cfg, origins);
}

}  // namespace deck

void resolve_layout(Config& cfg, int world_size) {
  auto& p = cfg.parallel;
  const std::string deck = cfg.deck_path.empty() ? std::string("deck") : cfg.deck_path;
  const auto fail = [&](std::string_view key, const std::string& what) {
    throw InputError(fmt::format("{}: {}: {}", deck, key, what));
  };

  if (world_size < 1) fail("parallel", fmt::format("the world has {} ranks; need at least 1", world_size));

  // How the model splits: known from the deck before any rank builds a model.
  const bool gpt = is_transformer(cfg.model.kind);
  const bool llama = cfg.model.kind == ModelKind::llama;
  const int layers = gpt ? cfg.model.layers : static_cast<int>(cfg.model.hidden.size()) + 1;
  if (gpt) {
    const auto& m = cfg.model;
    if (m.width % m.heads != 0)
      fail("model.width", fmt::format("{} is not a multiple of model.heads = {}", m.width, m.heads));
    if (m.heads % p.tensor != 0)
      fail("parallel.tensor", fmt::format("{} tensor ranks do not divide the {} attention heads "
                                          "(model.heads); each tensor rank holds whole heads",
                                          p.tensor, m.heads));
    if (llama) {
      const int kv = m.kv_heads_or_heads();
      if (m.heads % kv != 0)
        fail("model.kv_heads", fmt::format("{} key/value heads do not divide the {} attention heads (model.heads); "
                                           "each key/value head serves a whole group of query heads", kv, m.heads));
      if (kv % p.tensor != 0)
        fail("parallel.tensor", fmt::format("{} tensor ranks do not divide the {} key/value heads (model.kv_heads); "
                                            "each tensor rank holds whole key/value heads", p.tensor, kv));
      if ((m.width / m.heads) % 2 != 0)
        fail("model.heads", fmt::format("heads of width {} (model.width / model.heads) are odd; the rotary "
                                        "embedding turns pairs of channels", m.width / m.heads));
      if (m.ffn_width_or_default() % p.tensor != 0)
        fail("parallel.tensor", fmt::format("{} tensor ranks do not divide the MLP's hidden width {} "
                                            "(model.ffn_width)", p.tensor, m.ffn_width_or_default()));
    }
  } else {
    for (std::size_t i = 0; i < cfg.model.hidden.size(); ++i)
      if (cfg.model.hidden[i] % p.tensor != 0)
        fail("parallel.tensor", fmt::format("{} tensor ranks do not divide model.hidden[{}] = {}; "
                                            "every hidden width must be a multiple of parallel.tensor",
                                            p.tensor, i, cfg.model.hidden[i]));
  }
  if (gpt && cfg.model.window > cfg.model.context)
    fail("model.window", fmt::format("{} positions is more than the model.context of {} (a window as long as the "
                                     "context is full causal attention: set 0)", cfg.model.window, cfg.model.context));
  if (!gpt && cfg.model.window != 0)
    fail("model.window", fmt::format("{} sets a transformer's sliding-window attention; model.kind = \"{}\" has no "
                                     "attention: remove it", cfg.model.window, to_string(cfg.model.kind)));
  if (!gpt && cfg.parallel.context_comm != ContextComm::all_to_all)
    fail("parallel.context_comm", fmt::format("\"{}\" chooses a transformer's context parallelism; model.kind = "
                                              "\"{}\" has none: remove it", to_string(cfg.parallel.context_comm),
                                              to_string(cfg.model.kind)));
  if (!llama) {  // the Llama family's keys, refused where they would change nothing
    const ModelConfig defaults;
    const auto refuse = [&](std::string_view key, const std::string& value, const std::string& fix) {
      fail(key, fmt::format("{} configures a model.kind = \"llama\"; model.kind = \"{}\" has no such part ({})", value,
                            to_string(cfg.model.kind), fix));
    };
    if (cfg.model.kv_heads != defaults.kv_heads)
      refuse("model.kv_heads", std::to_string(cfg.model.kv_heads), "remove it or set 0");
    if (cfg.model.ffn_width != defaults.ffn_width)
      refuse("model.ffn_width", std::to_string(cfg.model.ffn_width), "remove it or set 0");
    if (cfg.model.rope_theta != defaults.rope_theta)
      refuse("model.rope_theta", fmt::format("{}", cfg.model.rope_theta), "remove it");
    if (cfg.model.norm_eps != defaults.norm_eps)
      refuse("model.norm_eps", fmt::format("{}", cfg.model.norm_eps), "remove it");
    if (!cfg.model.tie_embeddings)
      refuse("model.tie_embeddings", "false", "its head is always the token embedding: remove it");
  }
  if (cfg.model.kind != ModelKind::gpt && cfg.model.gelu_approximate != GeluApproximate::none)
    fail("model.gelu_approximate",
         fmt::format("\"{}\" chooses the gpt's GELU; model.kind = \"{}\" {}; set it to \"none\"",
                     to_string(cfg.model.gelu_approximate), to_string(cfg.model.kind),
                     llama ? "has none (its MLP is SwiGLU)" : "uses the exact one (model.activation = \"gelu\")"));
  const bool unet = cfg.model.kind == ModelKind::unet;
  if (cfg.model.kind == ModelKind::cnn && p.pipeline > 1)
    fail("parallel.pipeline", fmt::format("{} stages: the cnn runs on one pipeline stage (set "
                                          "parallel.pipeline = 1; tensor and data parallelism apply)", p.pipeline));
  if (unet && (p.pipeline > 1 || p.tensor > 1))
    fail(p.pipeline > 1 ? "parallel.pipeline" : "parallel.tensor",
         fmt::format("tensor={} x pipeline={}: the unet runs on one stage and one tensor rank (set both to 1; "
                     "data and spatial parallelism and ZeRO apply)", p.tensor, p.pipeline));
  if (p.spatial > 1 && !unet && !gpt)
    fail("parallel.spatial", fmt::format("{} ranks per sample, but model.kind = \"{}\" has no spatial dimensions to "
                                         "split (spatial parallelism splits the fields of a model.kind = \"unet\" "
                                         "and the sequences of a transformer); set parallel.spatial = 1",
                                         p.spatial, to_string(cfg.model.kind)));
  if (p.spatial > 1 && gpt) {  // context parallelism (nn/context_parallel.cpp, nn/context_ring.cpp)
    const auto& m = cfg.model;
    const bool ring = p.context_comm == ContextComm::ring;
    // The ring's causal load balancing gives each rank two chunks (a head and a tail) of every
    // sequence; a window's halo and the all-to-all take one block.
    const int chunks = context_head_tail(cfg) ? 2 * p.spatial : p.spatial;
    if (m.context % chunks != 0 || m.context / p.spatial < 2)
      fail("parallel.spatial",
           fmt::format("{} ranks share each sequence of model.context = {} tokens in {} equal chunks{}, at least 2 "
                       "tokens per rank; set a context divisible by {}", p.spatial, m.context, chunks,
                       chunks != p.spatial ? " (parallel.context_comm = \"ring\": a head and a tail chunk per rank)"
                                           : "",
                       chunks));
    if (!ring && (m.heads / p.tensor) % p.spatial != 0)
      fail("parallel.spatial", fmt::format("{} context ranks regroup the attention by heads (all-to-all): they must "
                                           "divide the {} heads of each tensor rank (model.heads = {} / "
                                           "parallel.tensor = {}), or set parallel.context_comm = \"ring\"",
                                           p.spatial, m.heads / p.tensor, m.heads, p.tensor));
  }
  if ((cfg.model.kind == ModelKind::cnn || unet) && cfg.model.kernel % 2 == 0)
    fail("model.kernel", fmt::format("{} is even; a {} kernel is odd (zero padding kernel/2 keeps the size)",
                                     cfg.model.kernel, to_string(cfg.model.kind)));
  if (cfg.data.normalize == FieldNormalize::channel && !unet)
    fail("data.normalize", fmt::format("\"channel\" standardises the fields of a model.kind = \"unet\"; "
                                       "model.kind = \"{}\" has none (use \"auto\" or \"none\")",
                                       to_string(cfg.model.kind)));
  if (unet && cfg.model.channels.empty())
    fail("model.channels", "[] gives the unet no level; give the channels of each level, finest first (e.g. [16, 32, 64])");
  if (cfg.train.precision == Precision::fp16 && (cfg.train.loss_scale < 1.0 || cfg.train.loss_scale > 16777216.0))
    fail("train.loss_scale", fmt::format("{} with train.precision = \"fp16\": the dynamic loss scale "
                                         "lives in [1, 2^24]", cfg.train.loss_scale));
  if (cfg.train.recompute && !gpt)
    fail("train.recompute", fmt::format("recomputation works on transformer blocks; model.kind = \"{}\" "
                                        "has none (set train.recompute = false)", to_string(cfg.model.kind)));
  if (p.pipeline > layers)
    fail("parallel.pipeline", fmt::format("{} stages for a model of {} {}; at most one stage per "
                                          "{} (set parallel.pipeline <= {})", p.pipeline, layers,
                                          gpt ? "blocks" : "layers", gpt ? "block" : "layer", layers));
  if (p.virtual_stages > 1) {
    // Interleaved 1F1B: v chunks per stage, micro-batches in groups of the stages.
    const int v = p.virtual_stages;
    if (p.pipeline < 2)
      fail("parallel.virtual_stages", fmt::format("{} chunks per stage interleave the stages of a pipeline, but "
                                                  "parallel.pipeline = 1 (set parallel.pipeline >= 2 or "
                                                  "parallel.virtual_stages = 1)", v));
    if (p.schedule != PipelineSchedule::one_f_one_b)
      fail("parallel.virtual_stages", fmt::format("{} chunks per stage run the interleaved 1F1B schedule; "
                                                  "parallel.schedule = \"gpipe\" has no interleaved form (set "
                                                  "parallel.schedule = \"1f1b\" or parallel.virtual_stages = 1)", v));
    if (static_cast<long long>(p.pipeline) * v > layers)
      fail("parallel.virtual_stages", fmt::format("pipeline={} x virtual_stages={} = {} chunks for a model of {} {}; "
                                                  "at most one chunk per {} (set parallel.virtual_stages <= {})",
                                                  p.pipeline, v, static_cast<long long>(p.pipeline) * v, layers,
                                                  gpt ? "blocks" : "layers", gpt ? "block" : "layer",
                                                  layers / p.pipeline));
    if (p.micro_batches % p.pipeline != 0)
      fail("parallel.micro_batches", fmt::format("{} with parallel.virtual_stages = {}: the interleaved schedule "
                                                 "runs micro-batches in groups of parallel.pipeline = {}; allowed: a "
                                                 "multiple of {}", p.micro_batches, v, p.pipeline, p.pipeline));
    if (static_cast<long long>(p.micro_batches) * v > (1 << 20))
      fail("parallel.micro_batches", fmt::format("{} x parallel.virtual_stages = {} chunk passes per step; at "
                                                 "most 2^20", p.micro_batches, v));
    if (p.zero == 0 && !cfg.comm.no_sync)
      fail("comm.no_sync", fmt::format("false with parallel.virtual_stages = {} and parallel.zero = 0: exchanging "
                                       "every micro-batch in place needs each backward to reach every layer of "
                                       "the stage, and an interleaved chunk's reaches its own only (set "
                                       "comm.no_sync = true, or parallel.zero >= 1)", v));
  }
  const long long chunks = static_cast<long long>(p.pipeline) * p.virtual_stages;
  if (!p.stages.empty()) {
    int sum = 0;
    for (int n : p.stages) sum += n;
    if (static_cast<long long>(p.stages.size()) != chunks || sum != layers)
      fail("parallel.stages", fmt::format("[{}] gives {} stages of {} layers in all; the deck asks for "
                                          "{} {} of the model's {} layers",
                                          fmt::join(p.stages, ", "), p.stages.size(), sum, chunks,
                                          p.virtual_stages > 1 ? "chunks (parallel.pipeline x parallel.virtual_stages)"
                                                               : "stages (parallel.pipeline)",
                                          layers));
  }

  // Resolve data = 0 and check that the grid fills the world.
  // In 64 bits: each dimension is at most 2^20 (the schema), so tensor x pipeline x spatial fits,
  // and so does its product with data once it is known not to exceed the world.
  const long long model_ranks = static_cast<long long>(p.tensor) * p.pipeline * p.spatial;
  const bool divides = world_size % model_ranks == 0;
  const std::string spatial = p.spatial > 1 ? fmt::format(" x spatial={}", p.spatial) : std::string();
  int data = p.data;
  if (data == 0) {
    if (!divides)
      fail("parallel", fmt::format("tensor={} x pipeline={}{} = {} does not divide the {} ranks mpirun started; "
                                   "run on a multiple of {} ranks",
                                   p.tensor, p.pipeline, spatial, model_ranks, world_size, model_ranks));
    data = static_cast<int>(world_size / model_ranks);
  }
  const long long grid = model_ranks > world_size ? model_ranks : static_cast<long long>(data) * model_ranks;
  if (grid != world_size) {
    const std::string fix = divides ? fmt::format("set parallel.data = {} or run on {} ranks",
                                                  world_size / model_ranks, grid)
                                    : fmt::format("run on {} ranks", grid);
    fail("parallel", fmt::format("data={} x tensor={} x pipeline={}{} = {} ranks, but mpirun started {}; {}",
                                 data, p.tensor, p.pipeline, spatial, grid, world_size, fix));
  }

  // Split the global batch over data ranks and micro-batches.
  const long long parts = static_cast<long long>(data) * p.micro_batches;
  const int batch = cfg.train.global_batch;
  if (batch % parts != 0) {
    const long long lower = batch / parts * parts;
    const long long upper = lower + parts;
    const std::string nearest = lower > 0 ? fmt::format("{} or {}", lower, upper) : fmt::format("{}", upper);
    fail("train.global_batch",
         fmt::format("{} does not split evenly over parallel.data={} x parallel.micro_batches={} = {} "
                     "parts; allowed: a multiple of {} (e.g. {})",
                     batch, data, p.micro_batches, parts, parts, nearest));
  }

  p.data = data;
  cfg.resolved_toml = to_toml(cfg);
}

}  // namespace tessera
