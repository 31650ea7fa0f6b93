#pragma once
// The trained model: its parameters (one flat buffer), its layers and its loss, plus the
// per-micro-batch buffers that feed it. Shapes come from the dataset.
#include <cstdint>
#include <limits>
#include <memory>
#include <vector>

#include "core/config.hpp"
#include "kernels/views.hpp"
#include "nn/hooks.hpp"
#include "nn/mlp.hpp"
#include "nn/param_store.hpp"

namespace tessera {

/// What the data says the model must look like.
struct ModelShape {
  std::int64_t in_features = 0;
  std::int64_t outputs = 0;       ///< classes, or target width
  bool classification = true;    ///< labels + cross-entropy, else targets + MSE
};

/// Sum of per-sample losses and correct predictions over one micro-batch.
struct LossSums {
  double loss = 0.0;
  double correct = 0.0;
};

/// How the parameter store is laid out and which of its buffers exist (see nn::ParamStore).
struct ParamLayout {
  int shards = 1;
  std::size_t bucket_elements = std::numeric_limits<std::size_t>::max();
  nn::Storage storage;
};

class Model {
 public:
  /// Builds the layers and, where the storage holds all values, initialises every parameter
  /// from (seed, name, index) (else the owner of the shards does).
  Model(const Config& cfg, const ModelShape& shape, int max_batch, const ParamLayout& layout = {});

  /// \brief Tells `hooks` (may be null) about each layer as forward and backward reach it.
  void set_hooks(nn::LayerHooks* hooks);

  /// \brief Forward and loss of one micro-batch, keeping what backward() needs.
  /// x (B, in); labels (B) or targets (B, outputs); loss_scale multiplies each sample's loss
  /// gradient (1 / global batch).
  LossSums forward(const ExecSpace& exec, MatrixU<const float> x,
                   VectorU<const std::int32_t> labels, MatrixU<const float> targets,
                   float loss_scale);
  /// \brief Backward of the last forward(); gradients accumulate in params().
  void backward(const ExecSpace& exec);
  /// \brief Forward and loss only (evaluation).
  LossSums forward_loss(const ExecSpace& exec, MatrixU<const float> x,
                        VectorU<const std::int32_t> labels, MatrixU<const float> targets);

  /// \brief For a rank with no samples in a micro-batch: tells the hooks about every layer as a
  /// forward (or backward) would, so it takes part in the collectives they start.
  void idle_forward();
  void idle_backward();

  nn::ParamStore<float>& params() { return *store_; }
  const nn::ParamStore<float>& params() const { return *store_; }
  const ModelShape& shape() const { return shape_; }
  int max_batch() const { return max_batch_; }
  /// Bytes of activation buffers this model holds (measured from its allocations).
  std::size_t activation_bytes() const;

 private:
  LossSums loss(const ExecSpace& exec, MatrixU<const float> logits,
                VectorU<const std::int32_t> labels, MatrixU<const float> targets, float scale);

  ModelShape shape_;
  int max_batch_;
  std::unique_ptr<nn::ParamStore<float>> store_;
  std::unique_ptr<nn::Mlp<float>> mlp_;
  Matrix<float> dlogits_;  // (max_batch, outputs)
  nn::LayerHooks* hooks_ = nullptr;
};

}  // namespace tessera
