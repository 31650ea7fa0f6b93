#pragma once
// The trained model as this rank holds it: its pipeline stage's layers (one chunk of them, or v
// interleaved chunks), its tensor rank's blocks of their parameters (one flat store), the loss on
// the last stage, and activation slots for the micro-batches in flight. Shapes come from the
// dataset.
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <utility>
#include <vector>

#include "core/config.hpp"
#include "kernels/views.hpp"
#include "nn/hooks.hpp"
#include "nn/cnn.hpp"
#include "nn/gpt.hpp"
#include "nn/halo.hpp"
#include "nn/network.hpp"
#include "nn/param_store.hpp"
#include "nn/unet.hpp"

namespace tessera {

/// What the data says the model must look like.
struct ModelShape {
  std::int64_t in_features = 0;
  std::int64_t outputs = 0;       ///< classes, or target width
  bool classification = true;    ///< labels + cross-entropy, else targets + MSE
  std::vector<std::int64_t> sample_shape;  ///< one sample's input shape ([H, W] or [C, H, W] images)
  std::vector<std::int64_t> target_shape;  ///< one sample's targets' shape (regression)
  nn::FieldNorm norm;  ///< unet: the training split's per-channel statistics (data.normalize); empty: none
};

using LossSums = nn::LossSums;

/// How the parameter store is laid out and which of its buffers exist (see nn::ParamStore).
struct ParamLayout {
  int shards = 1;
  std::size_t bucket_elements = std::numeric_limits<std::size_t>::max();
  nn::Storage storage;
};

/// Layers [first, end) of the model (blocks of a GPT); end -1: to the last.
struct LayerRange {
  int first = 0, end = -1;
};

/// Which part of the model a rank holds.
struct ModelPart {
  /// Its layer ranges in model order: its pipeline stage's, or under parallel.virtual_stages = v
  /// its v chunks of the interleaved schedule (stage_chunks).
  std::vector<LayerRange> chunks{LayerRange{}};
  int tp = 1, t = 0;                    ///< tensor ranks and this one
  std::function<void(float*, std::size_t)> tensor_sum;  ///< sum over the tensor group
  std::shared_ptr<nn::Halo<float>> halo;  ///< the spatial neighbours (unet); null: whole samples
  bool halo_overlap = true;               ///< parallel.halo_overlap
  /// A transformer's context parallelism (parallel.spatial): ranks sharing each sequence, this
  /// one, the all-to-all and the sum over them (nn::Gpt::Part).
  int sp = 1, s = 0;
  std::function<void(const float*, float*, std::size_t)> all_to_all;
  std::function<void(double*, std::size_t)> spatial_sum;
};

/// \brief Layer boundaries of the model's pipeline chunks: chunk j holds layers [b[j], b[j+1]),
/// j < pp * v (v = parallel.virtual_stages; with v = 1 a chunk is a stage). parallel.stages when
/// given, else contiguous chunks balanced by each layer's multiply-adds.
std::vector<int> stage_bounds(const Config& cfg, const ModelShape& shape);

/// \brief The layer ranges pipeline stage `stage` holds: chunk c is the model's chunk
/// c * pp + stage (Megatron's interleaving), so activations go from chunk c of the last stage
/// to chunk c + 1 of the first.
std::vector<LayerRange> stage_chunks(const Config& cfg, const std::vector<int>& bounds, int stage);

/// \brief InputError naming the deck key where a parameter tensor would hold more than 2^40
/// values, or the model more than 2^40 parameters, or the data's samples more than 2^31 - 1 values:
/// far beyond any node, and below them every size Tessera derives fits its integer types. Call
/// before anything is built from the shape.
void check_model_size(const Config& cfg, const ModelShape& shape);

/// \brief The CNN's dimensions from the deck and the data's image shape; InputError where the
/// data are no images or the pools would shrink them away.
nn::CnnShape cnn_shape(const Config& cfg, const ModelShape& shape);

/// \brief The U-Net's dimensions from the deck and the data's fields (this rank's block of rows
/// under parallel.spatial); InputError naming the key or the data where inputs or targets are not
/// [N, C, H, W] of the same H x W, or the spatial split and the levels' 2x2 pools do not divide
/// the field into blocks of even rows at least kernel/2 thick.
nn::UNetShape unet_shape(const Config& cfg, const ModelShape& shape);

/// \brief The GPT's dimensions from the deck and the data (vocabulary, context); throws
/// InputError where they disagree or the tensor ranks do not divide the vocabulary.
nn::GptShape gpt_shape(const Config& cfg, const ModelShape& shape);
/// \brief The sliding window a transformer's attention runs with: model.window, or 0 (full causal
/// attention) where that is 0 or at least model.context (a window that holds every position).
int attention_window(const ModelConfig& model);
/// Multiply-adds per token of one transformer block's products (its weights' elements: q, k, v, o and the MLP).
double block_weights(const Config& cfg);

/// \brief Builds the network of the deck's model kind for chunk `chunk` of `part`, registering
/// its parameters in `store` (nothing is allocated: plan and allocate the store, then reserve
/// the network). Every product of the network computes in train.precision, decided here once
/// for all its layers.
std::unique_ptr<nn::Network<float>> make_network(nn::ParamStore<float>& store, const Config& cfg,
                                                 const ModelShape& shape, const ModelPart& part = {},
                                                 std::size_t chunk = 0);

/// \brief One line naming the model: "mlp 784-512-512-10", "gpt 4 blocks x 4 heads, width 256, ...".
std::string describe_model(const Config& cfg, const ModelShape& shape);

/// \brief Every parameter of the whole model (names and logical shapes), whatever part a rank holds.
std::vector<nn::ParamInfo> logical_params(const Config& cfg, const ModelShape& shape);

class Model {
 public:
  /// Builds the part's layers, one network per chunk over one parameter store (no bucket spans
  /// two chunks), and, where the storage holds all values, initialises every parameter from
  /// (seed, name, logical index) (else the owner of the shards does).
  Model(const Config& cfg, const ModelShape& shape, int max_batch, const ParamLayout& layout = {},
        ModelPart part = {});

  /// \brief Tells `hooks` (may be null) about each layer as forward and backward reach it.
  void set_hooks(nn::LayerHooks* hooks);

  /// The chunks this rank holds (parallel.virtual_stages; 1 without interleaving).
  int chunks() const { return static_cast<int>(nets_.size()); }
  /// This rank holds the model's first layer (reads the inputs) or its last (the loss).
  bool first_stage() const { return nets_.front()->first_stage(); }
  bool last_stage() const { return nets_.back()->last_stage(); }
  /// Chunk c holds the model's first layer, or its last.
  bool first_chunk(int c) const { return net(c).first_stage(); }
  bool last_chunk(int c) const { return net(c).last_stage(); }

  /// \brief A micro-batch in flight through chunk c (see nn::Network): acquire a slot, fill
  /// input() (data on the model's first chunk, the previous chunk's output otherwise),
  /// forward(); on the last chunk loss(); elsewhere fill grad_output() from the next chunk;
  /// backward(); send grad_input() back (not on the first chunk); release().
  int acquire(int c, int rows);
  void release(int c, int slot);
  MatrixU<float> input(int c, int slot) const { return net(c).input(slot); }
  MatrixU<float> output(int c, int slot) const { return net(c).output(slot); }
  MatrixU<float> grad_output(int c, int slot) const { return net(c).grad_output(slot); }
  MatrixU<float> grad_input(int c, int slot) const { return net(c).grad_input(slot); }
  void forward(const ExecSpace& exec, int c, int slot) { net(c).forward(exec, slot); }
  void backward(const ExecSpace& exec, int c, int slot) { net(c).backward(exec, slot); }
  /// \brief The last chunk: the loss of the slot's output against labels (B) or targets (B,
  /// outputs), and its gradient times loss_scale (1 / global batch) into grad_output(slot).
  LossSums loss(const ExecSpace& exec, int slot, VectorU<const std::int32_t> labels,
                MatrixU<const float> targets, float loss_scale);

  /// \brief For a rank with no samples in a micro-batch: tells the hooks about every layer of
  /// chunk c as a forward (or backward) would, so it takes part in the collectives they start.
  void idle_forward(int c);
  void idle_backward(int c);

  nn::ParamStore<float>& params() { return *store_; }
  /// The network of chunk c, of the deck's model kind (nn::Mlp, nn::Gpt, ...).
  nn::Network<float>& network(int c = 0) { return net(c); }
  /// The halo exchange of a model split over spatial ranks; null otherwise.
  const nn::Halo<float>* halo() const { return halo_.get(); }
  const nn::ParamStore<float>& params() const { return *store_; }
  const ModelShape& shape() const { return shape_; }
  int max_batch() const { return max_batch_; }
  /// Activation slots (one chunk's activations of one micro-batch) live now and at most at once.
  int live_slots() const { return live_; }
  int peak_slots() const { return peak_; }

 private:
  nn::Network<float>& net(int c) const { return *nets_.at(static_cast<std::size_t>(c)); }

  ModelShape shape_;
  int max_batch_;
  std::unique_ptr<nn::ParamStore<float>> store_;
  std::vector<std::unique_ptr<nn::Network<float>>> nets_;  // per chunk
  std::vector<std::pair<std::size_t, std::size_t>> units_;  // per chunk: its store units [first, end)
  std::shared_ptr<nn::Halo<float>> halo_;
  nn::LayerHooks* hooks_ = nullptr;
  int live_ = 0, peak_ = 0;
};

}  // namespace tessera
