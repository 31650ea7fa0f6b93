#include "nn/mlp.hpp"

#include <stdexcept>
#include <string>

#include "core/memory.hpp"
#include "kernels/activation.hpp"

namespace tessera::nn {

template <class T>
Mlp<T>::Mlp(ParamStore<T>& store, int in, std::vector<int> hidden, int out, Activation act)
    : act_(act) {
  int width = in;
  for (std::size_t i = 0; i <= hidden.size(); ++i) {
    const int next = i < hidden.size() ? hidden[i] : out;
    if (width <= 0 || next <= 0) {
      throw std::invalid_argument("tessera::nn::Mlp: layer " + std::to_string(i) + " is " +
                                  std::to_string(width) + " -> " + std::to_string(next) +
                                  "; every width must be positive");
    }
    layers_.emplace_back(store, "layers." + std::to_string(i), width, next);
    width = next;
  }
}

template <class T>
void Mlp<T>::reserve(int max_batch) {
  if (max_batch <= max_batch_) return;
  max_batch_ = max_batch;
  pre_.clear();
  post_.clear();
  grad_.clear();
  for (std::size_t i = 0; i + 1 < layers_.size(); ++i) {
    const auto width = std::size_t(layers_[i].out_features());
    const std::string layer = mem::label(mem::Category::act, "tessera::nn::Mlp::layers." + std::to_string(i));
    pre_.emplace_back(Kokkos::view_alloc(layer + "::pre", Kokkos::WithoutInitializing), max_batch, width);
    post_.emplace_back(Kokkos::view_alloc(layer + "::post", Kokkos::WithoutInitializing), max_batch, width);
    grad_.emplace_back(Kokkos::view_alloc(layer + "::grad", Kokkos::WithoutInitializing), max_batch, width);
  }
  logits_ = Matrix<T>(Kokkos::view_alloc(mem::label(mem::Category::act, "tessera::nn::Mlp::logits"), Kokkos::WithoutInitializing),
                      max_batch, out_features());
}

template <class T>
MatrixU<T> Mlp<T>::forward(const ExecSpace& exec, const MatrixU<const T>& x) {
  ScopedRegion region("tessera::nn::Mlp::forward");
  batch_ = int(x.extent(0));
  if (batch_ > max_batch_) {
    throw std::invalid_argument("tessera::nn::Mlp::forward: batch of " + std::to_string(batch_) +
                                " rows exceeds reserve(" + std::to_string(max_batch_) + ")");
  }
  input_ = x;
  MatrixU<const T> h = x;
  for (std::size_t i = 0; i + 1 < layers_.size(); ++i) {
    const MatrixU<T> z = rows(pre_[i], batch_), a = rows(post_[i], batch_);
    if (hooks_) hooks_->before_forward(layers_[i].unit());
    layers_[i].forward(exec, h, z);
    if (hooks_) hooks_->after_forward(layers_[i].unit());
    if (act_ == Activation::relu) {
      kernels::relu_forward(exec, flat(z), flat(a));
    } else {
      kernels::gelu_forward(exec, flat(z), flat(a));
    }
    h = a;
  }
  const MatrixU<T> logits = rows(logits_, batch_);
  if (hooks_) hooks_->before_forward(layers_.back().unit());
  layers_.back().forward(exec, h, logits);
  if (hooks_) hooks_->after_forward(layers_.back().unit());
  return logits;
}

template <class T>
void Mlp<T>::backward(const ExecSpace& exec, const MatrixU<const T>& dlogits) {
  ScopedRegion region("tessera::nn::Mlp::backward");
  if (int(dlogits.extent(0)) != batch_) {
    throw std::invalid_argument("tessera::nn::Mlp::backward: dlogits has " +
                                std::to_string(dlogits.extent(0)) + " rows, the last forward " +
                                std::to_string(batch_));
  }
  MatrixU<const T> dy = dlogits;
  for (std::size_t i = layers_.size(); i-- > 0;) {
    // The layer's input, and where its input gradient goes (none for the first layer).
    const MatrixU<const T> x = i == 0 ? input_ : MatrixU<const T>(rows(post_[i - 1], batch_));
    const MatrixU<T> dx = i == 0 ? MatrixU<T>() : rows(grad_[i - 1], batch_);
    if (hooks_) hooks_->before_backward(layers_[i].unit());
    layers_[i].backward(exec, x, dy, dx);
    if (hooks_) hooks_->after_backward(layers_[i].unit());
    if (i == 0) break;
    // Through the activation in place: dL/dz = act'(z) dL/da.
    const MatrixU<T> z = rows(pre_[i - 1], batch_);
    if (act_ == Activation::relu) {
      kernels::relu_backward(exec, flat(z), flat(dx), flat(dx));
    } else {
      kernels::gelu_backward(exec, flat(z), flat(dx), flat(dx));
    }
    dy = dx;
  }
}

template <class T>
std::size_t Mlp<T>::activation_bytes() const {
  std::size_t n = logits_.span();
  for (const auto* group : {&pre_, &post_, &grad_})
    for (const auto& m : *group) n += m.span();
  return n * sizeof(T);
}

template class Mlp<float>;
template class Mlp<double>;

}  // namespace tessera::nn
