// The deck schema: every key of docs/deck.md, one row each. Defaults come from a default Config.
#include "core/deck_schema.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>

namespace tessera::deck {
namespace {

// Ranges, read as they are written in docs/deck.md.
Range at_least(double lo, std::string_view note = {}) { return {Bound{lo}, std::nullopt, note}; }
Range above(double lo) { return {Bound{lo, true}, std::nullopt, {}}; }
Range closed(double lo, double hi) { return {Bound{lo}, Bound{hi}, {}}; }
Range closed_open(double lo, double hi) { return {Bound{lo}, Bound{hi, true}, {}}; }
Range open_closed(double lo, double hi) { return {Bound{lo, true}, Bound{hi}, {}}; }

enum class Text { any, non_empty };

template <class>
inline constexpr bool kAlwaysFalse = false;

/// Builds the rows of one section; `Sec` is the section's member of Config.
template <auto Sec>
struct Section {
  std::string_view name;

  KeySpec row(std::string_view key, KeyType type, std::string_view doc) const {
    KeySpec k;
    k.section = name;
    k.name = key;
    k.type = type;
    k.doc = doc;
    return k;
  }

  template <auto Mem>
  static auto& field(Config& c) { return (c.*Sec).*Mem; }
  template <auto Mem>
  static const auto& field(const Config& c) { return (c.*Sec).*Mem; }

  /// An integer, float or integer-array key.
  template <auto Mem>
  KeySpec key(std::string_view key, Range range, std::string_view doc) const {
    using T = std::remove_cvref_t<decltype(field<Mem>(std::declval<Config&>()))>;
    KeySpec k = row(key, KeyType::integer, doc);
    k.range = range;
    if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
      k.int_min = std::is_signed_v<T> ? std::int64_t{std::numeric_limits<T>::min()} : 0;
      k.int_max = static_cast<std::int64_t>(
          std::min<std::uint64_t>(std::numeric_limits<T>::max(), INT64_MAX));
      k.get = [](const Config& c) -> Value { return static_cast<std::int64_t>(field<Mem>(c)); };
      k.set = [](Config& c, const Value& v) { field<Mem>(c) = static_cast<T>(std::get<std::int64_t>(v)); };
    } else if constexpr (std::is_floating_point_v<T>) {
      k.type = KeyType::floating;
      k.get = [](const Config& c) -> Value { return static_cast<double>(field<Mem>(c)); };
      k.set = [](Config& c, const Value& v) { field<Mem>(c) = static_cast<T>(std::get<double>(v)); };
    } else if constexpr (std::is_same_v<T, std::vector<int>>) {
      k.type = KeyType::int_array;
      k.int_min = std::numeric_limits<int>::min();
      k.int_max = std::numeric_limits<int>::max();
      k.get = [](const Config& c) -> Value {
        const auto& src = field<Mem>(c);
        return std::vector<std::int64_t>(src.begin(), src.end());
      };
      k.set = [](Config& c, const Value& v) {
        const auto& src = std::get<std::vector<std::int64_t>>(v);
        field<Mem>(c).assign(src.begin(), src.end());
      };
    } else {
      static_assert(kAlwaysFalse<T>, "key<>() takes integer, float and std::vector<int> members");
    }
    return k;
  }

  template <auto Mem>
  KeySpec flag(std::string_view key, std::string_view doc) const {
    KeySpec k = row(key, KeyType::boolean, doc);
    k.get = [](const Config& c) -> Value { return static_cast<bool>(field<Mem>(c)); };
    k.set = [](Config& c, const Value& v) { field<Mem>(c) = std::get<bool>(v); };
    return k;
  }

  template <auto Mem>
  KeySpec text(std::string_view key, Text rule, std::string_view doc) const {
    KeySpec k = row(key, KeyType::string, doc);
    k.non_empty = rule == Text::non_empty;
    k.get = [](const Config& c) -> Value { return std::string(field<Mem>(c)); };
    k.set = [](Config& c, const Value& v) { field<Mem>(c) = std::get<std::string>(v); };
    return k;
  }

  template <auto Mem, class E, std::size_t N>
  KeySpec choice(std::string_view key, const Choice<E> (&table)[N], std::string_view doc) const {
    KeySpec k = row(key, KeyType::choice, doc);
    for (const auto& c : table) k.choices.push_back(c.name);
    k.get = [&table](const Config& c) -> Value {
      for (const auto& ch : table)
        if (ch.value == field<Mem>(c)) return std::string(ch.name);
      return std::string("?");
    };
    k.set = [&table](Config& c, const Value& v) {
      for (const auto& ch : table)
        if (ch.name == std::get<std::string>(v)) field<Mem>(c) = ch.value;
    };
    return k;
  }
};

// Upper limits (docs/deck.md "Limits"): far beyond any machine, low enough that every size the
// deck implies is computed in 64 bits without overflow.
constexpr double kMaxWidth = 1 << 24;   // widths, channels, context, hidden sizes
constexpr double kMaxCount = 1 << 20;   // layers, heads, ranks per grid dimension, micro-batches
constexpr double kMaxSteps = static_cast<double>(std::int64_t{1} << 48);  // step counts

std::vector<KeySpec> build_schema() {
  constexpr Section<&Config::run> run{"run"};
  constexpr Section<&Config::data> data{"data"};
  constexpr Section<&Config::model> model{"model"};
  constexpr Section<&Config::parallel> parallel{"parallel"};
  constexpr Section<&Config::optimizer> optimizer{"optimizer"};
  constexpr Section<&Config::schedule> schedule{"schedule"};
  constexpr Section<&Config::train> train{"train"};
  constexpr Section<&Config::eval> eval{"eval"};
  constexpr Section<&Config::checkpoint> checkpoint{"checkpoint"};
  constexpr Section<&Config::comm> comm{"comm"};
  using R = RunConfig;
  using D = DataConfig;
  using M = ModelConfig;
  using P = ParallelConfig;
  using O = OptimizerConfig;
  using S = ScheduleConfig;
  using T = TrainConfig;
  using E = EvalConfig;
  using C = CheckpointConfig;
  // clang-format off
  return {
    run.key<&R::seed>("seed", at_least(0), "seed of every random stream: initial weights, data order, dropout"),
    run.text<&R::output_dir>("output_dir", Text::non_empty, "directory of log.txt, metrics.csv, summary.json and checkpoints/"),
    run.flag<&R::overwrite>("overwrite", "allow replacing another run's outputs in output_dir"),
    run.key<&R::blas_threads>("blas_threads", closed(0, 4096), "BLAS threads per rank; 0: cores on the node / ranks on the node, at least 1"),
    run.choice<&R::gemm>("gemm", kGemmLibraries, "library of the host matrix products: auto (per precision, from the CPU: docs/precision.md), openblas, onednn; the run log's gemm line says which runs"),
    run.choice<&R::conv>("conv", kConvLibraries, "cnn, unet: how the float convolutions run on the CPU: auto (oneDNN's convolutions for fp32 where oneDNN has JIT kernels, AVX2 or better, and for bf16 where the CPU has bf16 instructions; im2col otherwise: docs/performance.md), im2col (one GEMM per sample, through run.gemm's library), onednn (fp16, and bf16 without bf16 instructions, stay on im2col); the run log's conv line says which runs"),
    run.key<&R::memory_limit_mb>("memory_limit_mb", closed(0, 1 << 30), "most memory one rank may hold, in MB (1e6 bytes): a run whose estimate exceeds it is refused before anything is allocated, and one whose measured peak (the program's counters) exceeds it stops after its first step, exit 2; 0: no limit"),

    data.text<&D::path>("path", Text::non_empty, "HDF5 dataset file (see `tessera prepare`)"),
    data.text<&D::train_split>("train_split", Text::non_empty, "group of the training split"),
    data.text<&D::test_split>("test_split", Text::non_empty, "group of the evaluation split"),
    data.flag<&D::cache>("cache", "read each split once per rank into memory instead of per batch"),
    data.choice<&D::normalize>("normalize", kFieldNormalize,
                               "unet: standardise inputs and targets per channel with the training split's mean and "
                               "std (channel); auto: channel for a unet"),

    model.choice<&M::kind>("kind", kModelKinds, "model family"),
    model.key<&M::hidden>("hidden", closed(1, kMaxWidth), "mlp, cnn: widths of the hidden linear layers, input to output; [] is a linear model (cnn: after the convolutions)"),
    model.choice<&M::activation>("activation", kActivations, "activation after each hidden layer"),
    model.choice<&M::gelu_approximate>("gelu_approximate", kGeluApproximates, "gpt: the MLP's GELU: none (exact, z Phi(z)) or tanh (GPT-2's own, Hugging Face's \"gelu_new\": z/2 (1 + tanh(sqrt(2/pi) (z + 0.044715 z^3))))"),
    model.choice<&M::loss>("loss", kLossKinds, "auto: cross-entropy for a dataset with labels, MSE for one with targets"),
    model.key<&M::channels>("channels", closed(1, kMaxWidth), "cnn: output channels of each convolution block (conv, ReLU, 2x2 max-pool); unet: channels of each level, finest first (one 2x2 down-sampling between levels)"),
    model.key<&M::kernel>("kernel", closed(1, 4095), "cnn, unet: side of the square convolution kernels (odd; zero padding kernel/2 keeps the size)"),
    model.key<&M::layers>("layers", closed(1, kMaxCount), "gpt, llama: transformer blocks"),
    model.key<&M::heads>("heads", closed(1, kMaxCount), "gpt, llama: attention heads per block (divides model.width)"),
    model.key<&M::width>("width", closed(1, kMaxWidth), "gpt, llama: embedding width"),
    model.key<&M::context>("context", closed(1, kMaxWidth), "gpt, llama: tokens per training sequence (and most a prompt plus generated tokens can see)"),
    model.key<&M::kv_heads>("kv_heads", closed(0, kMaxCount), "llama: key and value heads (grouped-query attention; divides model.heads, and parallel.tensor divides it); 0: model.heads"),
    model.key<&M::ffn_width>("ffn_width", closed(0, kMaxWidth), "llama: hidden width of the SwiGLU MLP (divisible by parallel.tensor); 0: the smallest multiple of 256 at least 8/3 model.width"),
    model.key<&M::rope_theta>("rope_theta", closed(1, 1e12), "llama: base of the rotary position embeddings' frequencies (Hugging Face's rope_theta)"),
    model.key<&M::norm_eps>("norm_eps", open_closed(0, 1), "llama: epsilon of the RMSNorms (Hugging Face's rms_norm_eps)"),
    model.key<&M::window>("window", closed(0, kMaxWidth), "gpt, llama: sliding-window attention: each position attends to itself and the window - 1 positions before it (Mistral's sliding_window); 0: every earlier position (at most model.context)"),
    model.flag<&M::tie_embeddings>("tie_embeddings", "the output head is the token embedding (gpt: always true); llama: false gives the head its own lm_head.weight"),

    parallel.key<&P::data>("data", closed(0, kMaxCount), "data-parallel ranks; 0: world size / (tensor * pipeline * spatial)"),
    parallel.key<&P::tensor>("tensor", closed(1, kMaxCount), "tensor-parallel ranks (Megatron: column- then row-parallel layers); must divide every hidden width"),
    parallel.key<&P::pipeline>("pipeline", closed(1, kMaxCount), "pipeline stages (at most the number of layers)"),
    parallel.key<&P::micro_batches>("micro_batches", closed(1, kMaxCount), "micro-batches per data-parallel rank and step (gradients accumulate)"),
    parallel.choice<&P::schedule>("schedule", kPipelineSchedules, "pipeline schedule: gpipe (all forwards, then all backwards) or 1f1b (one forward, one backward after warm-up)"),
    parallel.key<&P::stages>("stages", closed(1, kMaxCount), "layers per pipeline stage, first to last (sums to the layer count; with virtual_stages = v, per chunk: pipeline * v entries in model order); []: balanced by cost"),
    parallel.key<&P::virtual_stages>("virtual_stages", closed(1, kMaxCount), "chunks of layers per pipeline stage (interleaved 1F1B: stage s holds the model's chunks s, s + pipeline, ...); > 1 needs schedule 1f1b, pipeline >= 2 and micro_batches a multiple of pipeline"),
    parallel.key<&P::zero>("zero", closed(0, 3), "ZeRO stage over the data group: 0 off, 1 shards optimizer state, 2 also gradients, 3 also parameters"),
    parallel.choice<&P::zero_group>("zero_group", kZeroGroups, "zero >= 1: data shards over every rank holding the same parameters (data x spatial); node shards over those on each node and replicates across nodes (hybrid sharding: one reduce across nodes per shard)"),
    parallel.flag<&P::zero_prefetch>("zero_prefetch", "zero = 3: start gathering the bucket the model will need next (its read from the value file with optimizer.offload_values) while this one computes; one more gathered bucket held (false: each bucket gathered when it is needed)"),
    parallel.key<&P::spatial>("spatial", closed(1, kMaxCount), "ranks sharing each sample: unet, a block of each field's rows (halos exchanged before every convolution); gpt, llama, a block of each sequence's positions (context parallelism: the attention regroups by heads, all-to-all)"),
    parallel.choice<&P::context_comm>("context_comm", kContextComms, "gpt, llama with parallel.spatial > 1: all_to_all regroups the attention by heads (Ulysses; spatial divides the heads per tensor rank); ring passes keys and values around the context ranks by point-to-point (ring attention, each rank a head and a tail chunk of every sequence; with model.window, a halo of window - 1 positions from the preceding ranks)"),
    parallel.flag<&P::halo_overlap>("halo_overlap", "parallel.spatial > 1: compute each convolution's interior rows while its halo is in flight (false: exchange, then compute)"),
    parallel.flag<&P::tensor_within_node>("tensor_within_node", "a tensor group whose ranks are on more than one host is an error (exit 2 before the model is built) instead of a warning"),

    optimizer.choice<&O::kind>("kind", kOptimizerKinds, "optimizer"),
    optimizer.key<&O::lr>("lr", above(0), "peak learning rate (the schedule scales it)"),
    optimizer.key<&O::momentum>("momentum", closed_open(0, 1), "sgd: momentum"),
    optimizer.flag<&O::nesterov>("nesterov", "sgd: Nesterov momentum (needs momentum > 0)"),
    optimizer.key<&O::weight_decay>("weight_decay", at_least(0), "sgd: L2 term added to the gradient; adamw: decoupled decay"),
    optimizer.key<&O::beta1>("beta1", closed_open(0, 1), "adamw: decay of the first moment"),
    optimizer.key<&O::beta2>("beta2", closed_open(0, 1), "adamw: decay of the second moment"),
    optimizer.key<&O::eps>("eps", above(0), "adamw: added to the root of the second moment"),
    optimizer.key<&O::clip_grad_norm>("clip_grad_norm", at_least(0), "clip the global gradient norm to this; 0: no clipping"),
    optimizer.choice<&O::offload>("offload", kOptimizerOffloads, "where the optimizer state lives between steps: none (with the parameters), host (a GPU build: host memory, the update run on the host with the gradients and parameters streamed through optimizer.offload_buffer_mb; a CPU build: no change) or disk (a file per rank under optimizer.offload_path, streamed through optimizer.offload_buffer_mb); the same parameters bit for bit"),
    optimizer.text<&O::offload_path>("offload_path", Text::any, "optimizer.offload = disk: directory of the per-rank state files (node-local scratch); empty: $TMPDIR, else /tmp"),
    optimizer.key<&O::offload_buffer_mb>("offload_buffer_mb", closed(0.03, 1 << 20), "optimizer.offload = disk or host: host buffer the state (disk) and the staged gradients and parameters (a GPU build) stream through, in MB (all streams together)"),
    optimizer.flag<&O::offload_values>("offload_values", "optimizer.offload = disk at parallel.zero = 3: the rank's shard of the fp32 parameter values in a scratch file beside the state too; each bucket's chunk is read before its gather (forward and backward) and the update streams it with the state; the same parameters bit for bit"),
    optimizer.flag<&O::offload_overlap>("offload_overlap", "optimizer.offload = disk or host: read the next tile and write the last one while this one is updated (the buffer then holds three tiles of each stream); false: one tile at a time"),

    schedule.choice<&S::kind>("kind", kScheduleKinds, "learning-rate schedule after the warm-up"),
    schedule.key<&S::warmup_steps>("warmup_steps", closed(0, kMaxSteps), "linear warm-up from 0 to optimizer.lr over this many steps (all kinds)"),
    schedule.key<&S::min_lr>("min_lr", at_least(0), "cosine: learning rate reached at the last step; cosine_restarts: at the end of each cycle"),
    schedule.key<&S::step_size>("step_size", closed(1, kMaxSteps), "step: multiply the learning rate by gamma every step_size steps"),
    schedule.key<&S::gamma>("gamma", open_closed(0, 1), "step: factor applied every step_size steps"),
    schedule.key<&S::restart_steps>("restart_steps", closed(1, kMaxSteps), "cosine_restarts: steps of the first cosine cycle after the warm-up (SGDR's T_0)"),
    schedule.key<&S::restart_mult>("restart_mult", closed(1, 1024), "cosine_restarts: each cycle is this many times longer than the one before (SGDR's T_mult)"),

    train.key<&T::epochs>("epochs", at_least(0, "(>= 1 unless train.steps > 0)"), "passes over the training split"),
    train.key<&T::steps>("steps", closed(0, kMaxSteps), "optimizer steps; when > 0 it wins over epochs"),
    train.key<&T::global_batch>("global_batch", at_least(1), "samples per optimizer step, summed over all ranks"),
    train.key<&T::log_every>("log_every", at_least(1), "log a train row to metrics.csv every this many steps"),
    train.flag<&T::drop_last>("drop_last", "drop the last partial global batch of an epoch"),
    train.key<&T::check_replicas_every>("check_replicas_every", closed(0, kMaxSteps), "every this many steps the data replicas compare checksums of their parameters (and unsharded optimizer state) and stop on a difference (exit 3); 0: off"),
    train.flag<&T::recompute>("recompute", "activation recomputation: keep each block's input only and recompute its forward during backward"),
    train.choice<&T::precision>("precision", kPrecisions, "activations and matrix products in fp32, bf16 or fp16; master weights, optimizer and reductions stay fp32"),
    train.key<&T::loss_scale>("loss_scale", open_closed(0, 16777216), "fp16: initial dynamic loss scale (halved and the step skipped on overflow)"),
    train.key<&T::loss_scale_window>("loss_scale_window", at_least(1), "fp16: double the loss scale after this many steps without overflow"),

    eval.flag<&E::every_epoch>("every_epoch", "evaluate on the test split at the end of every epoch"),
    eval.key<&E::every_steps>("every_steps", closed(0, kMaxSteps), "also evaluate every this many steps; 0: off"),
    eval.flag<&E::at_end>("at_end", "evaluate once more at the end of training"),
    eval.key<&E::batch>("batch", at_least(1), "samples per rank per evaluation batch"),

    checkpoint.key<&C::every_steps>("every_steps", closed(0, kMaxSteps), "write a checkpoint every this many steps; 0: only at the end"),
    checkpoint.key<&C::keep>("keep", at_least(0), "newest complete checkpoints kept; 0 keeps all"),
    checkpoint.flag<&C::at_end>("at_end", "write a checkpoint at the end of training"),
    checkpoint.flag<&C::async>("async", "copy the checkpoint to host memory at the step and write it in the background while training goes on"),

    comm.choice<&CommConfig::allreduce>("allreduce", kAllreduceAlgorithms, "gradient allreduce algorithm: mpi (MPI_Allreduce), ring (reduce-scatter + allgather), parameter-server (through rank 0), hierarchical (reduce-scatter inside each node, allreduce of each shard across nodes, allgather inside the node)"),
    comm.key<&CommConfig::ring_segment_kb>("ring_segment_kb", closed(1, 1 << 20), "ring and parameter-server: KiB per point-to-point message, so large buffers pipeline"),
    comm.key<&CommConfig::bucket_mb>("bucket_mb", open_closed(0, 1 << 20), "gradient bucket size in MB (whole layers, filled from the last layer backwards); the unit of exchange and of ZeRO-3 gathering"),
    comm.flag<&CommConfig::overlap>("overlap", "start each full bucket's exchange (nonblocking, MPI's own algorithm) while backward continues"),
    comm.flag<&CommConfig::no_sync>("no_sync", "with micro_batches > 1 and zero <= 1: accumulate locally and exchange once per step; false: exchange every micro-batch"),
    comm.choice<&CommConfig::backend>("backend", kCommBackends, "how buffers travel: auto (host memory: mpi; device memory: nccl if built, else cuda-aware-mpi if MPI says so, else staged), mpi, cuda-aware-mpi (device pointers to MPI), staged (through a pinned host buffer), nccl"),
    comm.choice<&CommConfig::reduce_dtype>("reduce_dtype", kReduceDtypes, "element type the gradient sums travel in: fp32, or bf16 (each rank's values rounded to bf16, sums accumulated in fp32 at each addition and sent as bf16: half the bytes, about 3 significant digits)"),
    comm.key<&CommConfig::timeout_s>("timeout_s", above(0), "seconds a rank may wait in one collective, transfer or collective file operation before it ends the run with exit code 5 and a flight record (a peer died or hangs)"),
    comm.flag<&CommConfig::priority>("priority", "exchange each bucket in pieces of comm.piece_mb, the buckets of the first layers first, at most comm.inflight_mb in flight; a bucket's update waits at the latest for the next step's forward of its first layer (zero = 0, no clipping, no fp16; logs the previous step's gradient norm)"),
    comm.key<&CommConfig::piece_mb>("piece_mb", open_closed(0, 1 << 20), "comm.priority: largest piece of a bucket's exchange in MB"),
    comm.key<&CommConfig::inflight_mb>("inflight_mb", open_closed(0, 1 << 20), "comm.priority: bound on the MB of pieces in flight (one piece always may be)"),
  };
  // clang-format on
}

// A bound as a reader takes it in: 1048576 and above, a power of two as "2^20".
std::string number(double v) {
  int exponent = 0;
  if (v >= 1048576 && std::frexp(v, &exponent) == 0.5) return fmt::format("2^{}", exponent - 1);
  return fmt::format("{}", v);
}

std::string range_text(const Range& r) {
  std::string s;
  if (r.lo && r.hi) {
    s = fmt::format("in {}{}, {}{}", r.lo->open ? "(" : "[", number(r.lo->value), number(r.hi->value),
                    r.hi->open ? ")" : "]");
  } else if (r.lo) {
    s = fmt::format("{} {}", r.lo->open ? ">" : ">=", number(r.lo->value));
  } else if (r.hi) {
    s = fmt::format("{} {}", r.hi->open ? "<" : "<=", number(r.hi->value));
  }
  if (!r.note.empty()) s = s.empty() ? std::string(r.note) : fmt::format("{} {}", s, r.note);
  return s;
}

std::string with_range(std::string noun, const Range& r) {
  const std::string t = range_text(r);
  return t.empty() ? noun : fmt::format("{} {}", noun, t);
}

}  // namespace

const std::vector<KeySpec>& schema() {
  static const std::vector<KeySpec> keys = build_schema();
  return keys;
}

const std::vector<std::string_view>& sections() {
  static const std::vector<std::string_view> names = [] {
    std::vector<std::string_view> out;
    for (const auto& k : schema())
      if (out.empty() || out.back() != k.section) out.push_back(k.section);
    return out;
  }();
  return names;
}

const KeySpec* find_key(std::string_view section, std::string_view name) {
  for (const auto& k : schema())
    if (k.section == section && k.name == name) return &k;
  return nullptr;
}

std::string KeySpec::full_name() const { return fmt::format("{}.{}", section, name); }

std::string_view KeySpec::type_name() const {
  switch (type) {
    case KeyType::integer: return "integer";
    case KeyType::floating: return "float";
    case KeyType::boolean: return "boolean";
    case KeyType::string: return "string";
    case KeyType::int_array: return "integer array";
    case KeyType::choice: return "enum";
  }
  return "?";
}

std::string KeySpec::allowed() const {
  switch (type) {
    case KeyType::integer:
      // Show the range when the integer closed form reads better ("in 0..3").
      if (range.lo && range.hi && !range.lo->open && !range.hi->open)
        return fmt::format("an integer in {}..{}", number(range.lo->value), number(range.hi->value));
      return with_range("an integer", range);
    case KeyType::floating: return with_range("a float", range);
    case KeyType::boolean: return "true or false";
    case KeyType::string: return non_empty ? "a non-empty string" : "a string";
    case KeyType::int_array: return with_range("an array of integers", range) + ", possibly empty";
    case KeyType::choice: {
      std::string s = "one of";
      for (std::size_t i = 0; i < choices.size(); ++i)
        s += fmt::format("{} \"{}\"", i == 0 ? "" : ",", choices[i]);
      return s;
    }
  }
  return "?";
}

std::string format_value(const KeySpec& key, const Value& v) {
  switch (key.type) {
    case KeyType::integer: return fmt::format("{}", std::get<std::int64_t>(v));
    case KeyType::floating: {
      // Shortest text that reads back to the same double, always with a '.' or an exponent so
      // that it stays a TOML float.
      std::string s = fmt::format("{}", std::get<double>(v));
      if (s.find_first_of(".eEn") == std::string::npos) s += ".0";
      return s;
    }
    case KeyType::boolean: return std::get<bool>(v) ? "true" : "false";
    case KeyType::string:
    case KeyType::choice: return quote(std::get<std::string>(v));
    case KeyType::int_array: {
      const auto& a = std::get<std::vector<std::int64_t>>(v);
      return fmt::format("[{}]", fmt::join(a, ", "));
    }
  }
  return "?";
}

std::string quote(std::string_view s) {
  std::string out = "\"";
  for (const char ch : s) {
    switch (ch) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      case '\r': out += "\\r"; break;
      default:
        if (static_cast<unsigned char>(ch) < 0x20 || ch == 0x7f)
          out += fmt::format("\\u{:04X}", static_cast<unsigned char>(ch));
        else
          out += ch;
    }
  }
  return out + "\"";
}

bool in_range(const Range& r, double v) {
  if (r.lo && (r.lo->open ? !(v > r.lo->value) : !(v >= r.lo->value))) return false;
  if (r.hi && (r.hi->open ? !(v < r.hi->value) : !(v <= r.hi->value))) return false;
  return true;
}

}  // namespace tessera::deck
