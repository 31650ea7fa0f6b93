#pragma once
// Multi-layer perceptron: Linear, activation, Linear, activation, ..., Linear (no activation on
// the output). Parameters are named layers.{i}.weight and layers.{i}.bias, i = 0, 1, 2, ...
#include <vector>

#include "core/config.hpp"
#include "kernels/views.hpp"
#include "nn/hooks.hpp"
#include "nn/linear.hpp"
#include "nn/param_store.hpp"

namespace tessera::nn {

template <class T>
class Mlp {
 public:
  /// \brief Registers every layer's parameters in `store` (before store.allocate()).
  Mlp(ParamStore<T>& store, int in, std::vector<int> hidden, int out, Activation act);

  /// \brief Allocates the activation buffers for batches of up to max_batch rows.
  void reserve(int max_batch);
  int max_batch() const { return max_batch_; }
  /// Rows of the last forward().
  int batch() const { return batch_; }
  /// Bytes of the activation buffers reserve() allocated.
  std::size_t activation_bytes() const;

  /// \brief Returns the logits.  x (B,in) with B <= max_batch; returns (B,out), a view into
  /// this object's buffer, valid until the next forward. x must stay alive and unchanged until
  /// backward(), which reads it.
  MatrixU<T> forward(const ExecSpace& exec, const MatrixU<const T>& x);

  /// \brief Adds the gradient of the loss to the store's gradients (accumulates).
  /// dlogits (B,out), B as in the last forward(). The input gradient is not computed.
  void backward(const ExecSpace& exec, const MatrixU<const T>& dlogits);

  /// \brief Tells `hooks` (may be null) about each layer as forward and backward reach it.
  void set_hooks(LayerHooks* hooks) { hooks_ = hooks; }

  int in_features() const { return layers_.front().in_features(); }
  int out_features() const { return layers_.back().out_features(); }
  const std::vector<Linear<T>>& layers() const { return layers_; }

 private:
  MatrixU<T> rows(const Matrix<T>& buffer, int batch) const {
    return MatrixU<T>(buffer.data(), batch, buffer.extent(1));
  }

  Activation act_;
  LayerHooks* hooks_ = nullptr;
  std::vector<Linear<T>> layers_;
  int max_batch_ = 0;
  int batch_ = 0;                 // rows of the last forward
  MatrixU<const T> input_;        // x of the last forward
  std::vector<Matrix<T>> pre_;    // hidden layer i: z = x W^T + b   (max_batch, hidden[i])
  std::vector<Matrix<T>> post_;   // hidden layer i: a = act(z)      (max_batch, hidden[i])
  std::vector<Matrix<T>> grad_;   // hidden layer i: dL/da, then dL/dz in place
  Matrix<T> logits_;              // (max_batch, out)
};

extern template class Mlp<float>;
extern template class Mlp<double>;

}  // namespace tessera::nn
