#pragma once
// The trained model: its parameters (one flat buffer), its layers and its loss, plus the
// per-micro-batch buffers that feed it. Shapes come from the dataset.
#include <cstdint>
#include <memory>
#include <vector>

#include "core/config.hpp"
#include "kernels/views.hpp"
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

class Model {
 public:
  /// Builds the layers and initialises every parameter from (seed, name, index).
  Model(const Config& cfg, const ModelShape& shape, int max_batch);

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
};

}  // namespace tessera
