#pragma once
// The resolved input deck: every key of docs/deck.md with its type and default. The deck parser
// (core/deck.hpp) fills it; everything else reads it. Defaults live here and only here.
#include <cstdint>
#include <string>
#include <vector>

#include "core/conv_library.hpp"
#include "core/gemm_library.hpp"
#include "core/precision.hpp"

namespace tessera {

enum class ModelKind { mlp, cnn, gpt, unet, llama };
/// The decoder-only transformers (nn/gpt.hpp): GPT-2's block, or the Llama family's.
inline bool is_transformer(ModelKind k) { return k == ModelKind::gpt || k == ModelKind::llama; }
enum class Activation { relu, gelu };
/// model.gelu_approximate: the gpt's GELU, exact (erf) or GPT-2's tanh form (PyTorch's nn.GELU(approximate=...)).
enum class GeluApproximate { none, tanh };
enum class LossKind { automatic, cross_entropy, mse };  // automatic: labels -> CE, targets -> MSE
enum class FieldNormalize { automatic, none, channel };  // automatic: channel for a unet, else none
enum class OptimizerKind { sgd, adamw };
/// optimizer.offload: where the optimizer state lives between steps.
enum class OptimizerOffload { none, host, disk };
enum class ScheduleKind { constant, cosine, step, cosine_restarts };
enum class PipelineSchedule { gpipe, one_f_one_b };
/// parallel.zero_group: the ranks ZeRO spreads the state over (the whole replica group, or its ranks
/// on one node: hybrid sharding, replicated across nodes).
enum class ZeroGroup { replica, node };
/// How a transformer's context ranks (parallel.spatial) share the attention: regrouped by heads
/// (all-to-all, DeepSpeed Ulysses) or keys and values passed around a ring of point-to-point
/// transfers (ring attention; a sliding window's halo from the preceding ranks).
enum class ContextComm { all_to_all, ring };
enum class AllreduceAlgorithm { mpi, ring, parameter_server, hierarchical };
/// The element type gradient sums travel in (comm.reduce_dtype); sums accumulate in fp32 either way.
enum class ReduceDtype { fp32, bf16 };
/// How bytes travel (comm/backend.hpp): automatic picks from the buffers' memory and the build.
enum class CommBackend { automatic, mpi, cuda_aware_mpi, staged, nccl };

struct RunConfig {
  std::uint64_t seed = 1234;
  std::string output_dir = "runs/default";
  bool overwrite = false;   ///< allow replacing another run's outputs in output_dir
  int blas_threads = 0;     ///< 0: cores on the node / ranks on the node, at least 1
  GemmLibrary gemm = GemmLibrary::automatic;  ///< library of the host matrix products
  ConvLibrary conv = ConvLibrary::automatic;  ///< path of the CNN's and U-Net's convolutions
  double memory_limit_mb = 0.0;  ///< most MB one rank may hold (estimate before, counters after the first step); 0: no limit

  bool operator==(const RunConfig&) const = default;
};

struct DataConfig {
  std::string path = "data/fashion-mnist.h5";
  std::string train_split = "train";
  std::string test_split = "test";
  bool cache = false;  ///< read each split once per rank into memory instead of per batch
  FieldNormalize normalize = FieldNormalize::automatic;  ///< standardise fields per channel with the training split's statistics

  bool operator==(const DataConfig&) const = default;
};

struct ModelConfig {
  ModelKind kind = ModelKind::mlp;
  std::vector<int> hidden = {512, 512};  ///< mlp; cnn: the linear layers after the convolutions
  Activation activation = Activation::relu;
  GeluApproximate gelu_approximate = GeluApproximate::none;  ///< gpt: the MLP's GELU
  LossKind loss = LossKind::automatic;
  std::vector<int> channels = {32, 64};  ///< cnn: output channels of each conv (3x3, pad 1) + ReLU + 2x2 max-pool; unet: channels of each level
  int kernel = 3;                        ///< cnn, unet: square convolution kernel (odd; padding kernel/2)
  int layers = 4;                        ///< gpt: transformer blocks
  int heads = 4;                         ///< gpt: attention heads per block
  int width = 256;                       ///< gpt: embedding width (a multiple of heads)
  int context = 128;                     ///< gpt: tokens per sequence (position embeddings)
  int kv_heads = 0;          ///< llama: key/value heads (grouped-query attention); 0: model.heads
  int ffn_width = 0;         ///< llama: the SwiGLU MLP's hidden width; 0: llama_ffn_width(width)
  double rope_theta = 10000.0;  ///< llama: base of the rotary position embeddings' frequencies
  double norm_eps = 1e-5;       ///< llama: RMSNorm's epsilon
  bool tie_embeddings = true;   ///< the output head is the token embedding (gpt: always)
  int window = 0;  ///< gpt, llama: sliding-window attention over the W most recent positions; 0: all (causal)

  /// llama: model.kv_heads with 0 resolved to model.heads.
  int kv_heads_or_heads() const { return kv_heads > 0 ? kv_heads : heads; }
  /// llama: model.ffn_width with 0 resolved: the smallest multiple of 256 at least 8/3 of the
  /// width (the Llama reference's rule with multiple_of = 256).
  int ffn_width_or_default() const {
    if (ffn_width > 0) return ffn_width;
    const long long w = (8LL * width + 2) / 3;
    return static_cast<int>((w + 255) / 256 * 256);
  }

  bool operator==(const ModelConfig&) const = default;
};

struct ParallelConfig {
  int data = 0;  ///< 0: world size / (tensor * pipeline)
  int tensor = 1;
  int pipeline = 1;
  int micro_batches = 1;
  PipelineSchedule schedule = PipelineSchedule::one_f_one_b;
  std::vector<int> stages;  ///< layers per pipeline chunk (pipeline * virtual_stages); empty: balanced by cost
  int virtual_stages = 1;   ///< chunks per pipeline stage (interleaved 1F1B)
  int zero = 0;
  int spatial = 1;            ///< ranks sharing each sample's grid (blocks of rows; unet only)
  ZeroGroup zero_group = ZeroGroup::replica;  ///< shard over the replica group, or within each node
  bool zero_prefetch = true;  ///< zero 3: the next bucket's gather started while this one computes
  bool halo_overlap = true;   ///< compute each convolution's interior while its halo is in flight
  ContextComm context_comm = ContextComm::all_to_all;  ///< a transformer's context parallelism
  bool tensor_within_node = false;  ///< a tensor group whose ranks span hosts is an error, not a warning

  bool operator==(const ParallelConfig&) const = default;
};

struct OptimizerConfig {
  OptimizerKind kind = OptimizerKind::sgd;
  double lr = 0.05;
  double momentum = 0.9;       ///< sgd
  bool nesterov = false;       ///< sgd
  double weight_decay = 0.0;   ///< sgd: L2 added to the gradient; adamw: decoupled
  double beta1 = 0.9;          ///< adamw
  double beta2 = 0.999;        ///< adamw
  double eps = 1e-8;           ///< adamw
  double clip_grad_norm = 0.0; ///< 0: no clipping
  OptimizerOffload offload = OptimizerOffload::none;
  std::string offload_path;         ///< disk: the directory of the state files; "": $TMPDIR, else /tmp
  double offload_buffer_mb = 64.0;  ///< disk: the host buffer the state streams through, in MB
  bool offload_overlap = true;      ///< disk: read the next tile and write the last while updating
  bool offload_values = false;      ///< disk at zero 3: the value shard in a scratch file as well

  bool operator==(const OptimizerConfig&) const = default;
};

struct ScheduleConfig {
  ScheduleKind kind = ScheduleKind::constant;
  std::int64_t warmup_steps = 0;  ///< linear warm-up from 0 (all kinds)
  double min_lr = 0.0;            ///< cosine: floor reached at the last step
  std::int64_t step_size = 1000;  ///< step: multiply by gamma every step_size steps
  double gamma = 0.1;             ///< step
  std::int64_t restart_steps = 1000;  ///< cosine_restarts: length of the first cycle (T_0)
  std::int64_t restart_mult = 1;      ///< cosine_restarts: each cycle this many times the last (T_mult)

  bool operator==(const ScheduleConfig&) const = default;
};

struct TrainConfig {
  int epochs = 10;
  std::int64_t steps = 0;  ///< when > 0 it wins over epochs
  int global_batch = 128;
  int log_every = 50;
  bool drop_last = true;   ///< drop the last partial global batch of an epoch
  bool recompute = false;  ///< keep only each block's input; recompute its forward in backward
  std::int64_t check_replicas_every = 0;  ///< compare the data replicas' checksums every this many steps; 0: off
  Precision precision = Precision::fp32;
  double loss_scale = 65536.0;       ///< fp16: initial dynamic loss scale
  int loss_scale_window = 1000;      ///< fp16: double the scale after this many finite steps

  bool operator==(const TrainConfig&) const = default;
};

struct EvalConfig {
  bool every_epoch = true;
  std::int64_t every_steps = 0;  ///< 0: off
  bool at_end = true;
  int batch = 1000;              ///< samples per rank per evaluation batch

  bool operator==(const EvalConfig&) const = default;
};

struct CheckpointConfig {
  std::int64_t every_steps = 0;  ///< 0: only at the end
  int keep = 3;                  ///< newest complete checkpoints kept; 0 keeps all
  bool at_end = true;
  bool async = false;  ///< write in the background; the step pauses only to copy

  bool operator==(const CheckpointConfig&) const = default;
};

struct CommConfig {
  AllreduceAlgorithm allreduce = AllreduceAlgorithm::mpi;
  int ring_segment_kb = 1024;  ///< ring and parameter-server: KiB per pipelined message
  double bucket_mb = 4.0;      ///< gradient buckets of about this many MB, filled in reverse layer order
  bool overlap = false;        ///< start a full bucket's exchange while backward goes on
  bool no_sync = true;         ///< micro-batches: exchange once per step, not per micro-batch
  CommBackend backend = CommBackend::automatic;
  ReduceDtype reduce_dtype = ReduceDtype::fp32;  ///< wire type of the gradient sums (bf16 halves the bytes)
  double timeout_s = 600.0;    ///< a rank blocked this long in one operation ends the run (exit 5)
  bool priority = false;       ///< exchange in pieces, first layers first; updates deferred to the next forward
  double piece_mb = 1.0;       ///< comm.priority: largest piece of a bucket's exchange, MB
  double inflight_mb = 4.0;    ///< comm.priority: bound on the bytes of the pieces in flight, MB

  bool operator==(const CommConfig&) const = default;
};

struct Config {
  RunConfig run;
  DataConfig data;
  ModelConfig model;
  ParallelConfig parallel;
  OptimizerConfig optimizer;
  ScheduleConfig schedule;
  TrainConfig train;
  EvalConfig eval;
  CheckpointConfig checkpoint;
  CommConfig comm;

  std::string deck_path;      ///< as given on the command line
  std::string resolved_toml;  ///< every key with its final value, as TOML (stored in checkpoints)
  /// Combinations that are allowed but likely not meant ("the warm-up outlasts the run"), one
  /// line each; `check` prints them and `train` logs them.
  std::vector<std::string> warnings;

  bool operator==(const Config&) const = default;
};

/// \brief The sliding window a transformer's attention runs with: model.window, or 0 (full causal
/// attention) where that is 0 or at least model.context (a window that holds every position).
inline int attention_window(const ModelConfig& model) {
  return model.window > 0 && model.window < model.context ? model.window : 0;
}

/// True where a transformer's context ranks (parallel.spatial) each hold a head and a tail chunk
/// of every sequence (rank s: chunks s and 2 spatial - 1 - s of 2 spatial; the ring's causal load
/// balancing), false where each holds one block. The data's reader and the model both follow it.
inline bool context_head_tail(const Config& cfg) {
  return is_transformer(cfg.model.kind) && cfg.parallel.spatial > 1 &&
         cfg.parallel.context_comm == ContextComm::ring && attention_window(cfg.model) == 0;
}

}  // namespace tessera
