#include "nn/mlp.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <stdexcept>
#include <string>

#include "core/memory.hpp"
#include "kernels/activation.hpp"

namespace tessera::nn {

template <class T>
Split Mlp<T>::split_of(int i, int n, int tp) {
  if (tp <= 1) return Split::none;
  if (i % 2 == 1) return Split::row;
  return i + 1 < n ? Split::column : Split::none;
}

template <class T>
Mlp<T>::Mlp(ParamStore<T>& store, int in, std::vector<int> hidden, int out, Activation act, Part part)
    : act_(act), part_(std::move(part)) {
  std::vector<int> widths{in};
  widths.insert(widths.end(), hidden.begin(), hidden.end());
  widths.push_back(out);
  layers_total_ = static_cast<int>(widths.size()) - 1;
  first_ = part_.first_layer;
  end_ = part_.end_layer < 0 ? layers_total_ : part_.end_layer;
  if (first_ < 0 || first_ >= end_ || end_ > layers_total_)
    throw std::invalid_argument(fmt::format("tessera::nn::Mlp: layers [{}, {}) of {}", first_, end_, layers_total_));
  for (int i = 0; i < layers_total_; ++i) {
    if (widths[i] <= 0 || widths[i + 1] <= 0)
      throw std::invalid_argument(fmt::format("tessera::nn::Mlp: layer {} is {} -> {}; every width "
                                              "must be positive", i, widths[i], widths[i + 1]));
  }
  if (part_.tp > 1 && !part_.tensor_sum)
    throw std::invalid_argument("tessera::nn::Mlp: tensor parallelism needs a tensor_sum");
  layers_.reserve(static_cast<std::size_t>(end_ - first_));
  typename Linear<T>::Options options;
  options.precision = part_.precision;
  for (int i = first_; i < end_; ++i)
    layers_.emplace_back(store, fmt::format("layers.{}", i), widths[i], widths[i + 1],
                         split_of(i, layers_total_, part_.tp), part_.tp, part_.t, options);
}

template <class T>
void Mlp<T>::add_slot() {
  if (slots_.empty()) bf16_acts_ = bf16_activations<T>(part_.precision);
  Slot& s = slots_.emplace_back();
  const auto n_rows = static_cast<std::size_t>(this->max_batch());
  const auto alloc_of = [&]<class E>(E, const std::string& what, int width) {
    return Matrix<E>(Kokkos::view_alloc(mem::label(mem::Category::act, "tessera::nn::Mlp::" + what),
                                        Kokkos::WithoutInitializing),
                     n_rows, static_cast<std::size_t>(width));
  };
  const auto alloc = [&](const std::string& what, int width) { return alloc_of(T(), what, width); };
  s.input = alloc("input", input_width());
  if (!first_stage()) s.dinput = alloc("dinput", input_width());
  int widest = 0;
  for (int i = first_; i < end_; ++i) {
    const auto& layer = layers_[static_cast<std::size_t>(i - first_)];
    const std::string name = fmt::format("layers.{}", i);
    s.z.push_back(alloc(name + ".z", layer.out_features()));
    s.a.push_back(hidden(i) && !kept_bf16(i) ? alloc(name + ".a", layer.out_features()) : Matrix<T>());
    s.a16.push_back(kept_bf16(i) ? alloc_of(std::uint16_t(), name + ".a (bf16)", layer.out_features())
                                 : Matrix<std::uint16_t>());
    s.g.push_back(alloc(name + ".grad", layer.out_features()));
    if (hidden(i)) widest = std::max(widest, layer.out_features());
  }
  if (bf16_acts_ && widest > 0 && g16_.data() == nullptr)
    g16_ = alloc_of(std::uint16_t(), "dz (bf16)", widest);
}

template <class T>
double Mlp<T>::activation_bytes(int max_batch, int slots) const {
  // What add_slot() allocates: the input, dinput past the first stage; per layer z, the
  // activation's output (a hidden layer's; in bf16 where kept so) and the gradient.
  const bool bf16 = bf16_activations<T>(part_.precision);
  const double B = max_batch, f = sizeof(T), h = sizeof(std::uint16_t);
  const auto bytes = [&](double width, double size) { return mem::view_bytes(B * width, size); };
  double slot = bytes(input_width(), f) * (first_stage() ? 1.0 : 2.0);
  int widest = 0;
  for (int i = first_; i < end_; ++i) {
    const int out = layers_[static_cast<std::size_t>(i - first_)].out_features();
    slot += 2 * bytes(out, f) + (!hidden(i) ? 0.0 : bytes(out, bf16 && i + 1 < end_ ? h : f));
    if (hidden(i)) widest = std::max(widest, out);
  }
  // Shared: dL/dz in bf16 at the widest hidden layer.
  const double shared = bf16 && widest > 0 ? bytes(widest, h) : 0.0;
  return double(slots) * slot + shared;
}

template <class T>
bool Mlp<T>::bf16_acts() const {
  return checked_bf16_activations(bf16_acts_, part_.precision, "Mlp");
}

template <class T>
MatrixU<T> Mlp<T>::input(int slot) const {
  return rows(slots_[static_cast<std::size_t>(slot)].input, this->batch_of(slot));
}

template <class T>
MatrixU<T> Mlp<T>::output(int slot) const {
  const int batch = this->batch_of(slot);
  const Slot& s = slots_[static_cast<std::size_t>(slot)];
  return rows(hidden(end_ - 1) ? s.a.back() : s.z.back(), batch);
}

template <class T>
MatrixU<T> Mlp<T>::grad_output(int slot) const {
  const int batch = this->batch_of(slot);
  return rows(slots_[static_cast<std::size_t>(slot)].g.back(), batch);
}

template <class T>
MatrixU<T> Mlp<T>::grad_input(int slot) const {
  if (first_stage()) throw std::logic_error("tessera::nn::Mlp::grad_input on the first stage");
  const int batch = this->batch_of(slot);
  return rows(slots_[static_cast<std::size_t>(slot)].dinput, batch);
}

template <class T>
void Mlp<T>::forward(const ExecSpace& exec, int slot) {
  ScopedRegion region("tessera::nn::Mlp::forward");
  const int batch = this->batch_of(slot);
  const Slot& s = slots_[static_cast<std::size_t>(slot)];
  bf16_acts();
  MatrixU<const T> x = rows(s.input, batch);
  Bf16Matrix x16;  // the input where the previous layer kept it in bf16
  const auto activate = [&](const MatrixU<T>& z, const auto& a) {
    if (act_ == Activation::relu) kernels::relu_forward(exec, flat(z), flat(a));
    else kernels::gelu_forward(exec, flat(z), flat(a));
  };
  for (int i = first_; i < end_; ++i) {
    const auto k = static_cast<std::size_t>(i - first_);
    const auto& layer = layers_[k];
    const MatrixU<T> z = rows(s.z[k], batch);
    if (hooks_) hooks_->before_forward(layer.unit());
    if (x16.data() != nullptr) layer.forward_bf16(exec, x16, z, part_.tensor_sum);
    else layer.forward(exec, x, z, part_.tensor_sum);
    if (hooks_) hooks_->after_forward(layer.unit());
    if (!hidden(i)) break;
    if (kept_bf16(i)) {
      const MatrixU<std::uint16_t> a = first_rows(s.a16[k], std::size_t(batch));
      activate(z, a);
      x16 = a;
    } else {
      const MatrixU<T> a = rows(s.a[k], batch);
      activate(z, a);
      x = a;
      x16 = {};
    }
  }
}

template <class T>
void Mlp<T>::backward(const ExecSpace& exec, int slot) {
  ScopedRegion region("tessera::nn::Mlp::backward");
  const int batch = this->batch_of(slot);
  const Slot& s = slots_[static_cast<std::size_t>(slot)];
  for (int i = end_; i-- > first_;) {
    const auto k = static_cast<std::size_t>(i - first_);
    const auto& layer = layers_[k];
    const MatrixU<T> g = rows(s.g[k], batch);
    // Through the activation in place: dL/dz = act'(z) dL/da (and in bf16 for the products).
    const bool twice = hidden(i) && bf16_acts_;
    const MatrixU<std::uint16_t> d16 =
        twice ? MatrixU<std::uint16_t>(g16_.data(), g.extent(0), g.extent(1)) : MatrixU<std::uint16_t>();
    if (twice) {
      const MatrixU<T> z = rows(s.z[k], batch);
      if (act_ == Activation::relu)
        kernels::activation_backward_twice<kernels::ReluGrad>(exec, flat(z), flat(g), flat(g), flat(d16));
      else
        kernels::activation_backward_twice<kernels::GeluGrad>(exec, flat(z), flat(g), flat(g), flat(d16));
    } else if (hidden(i)) {
      const MatrixU<T> z = rows(s.z[k], batch);
      if (act_ == Activation::relu) kernels::relu_backward(exec, flat(z), flat(g), flat(g));
      else kernels::gelu_backward(exec, flat(z), flat(g), flat(g));
    }
    const bool x_bf16 = i > first_ && kept_bf16(i - 1);
    const MatrixU<const T> x = i == first_ ? rows(s.input, batch) : x_bf16 ? MatrixU<const T>() : rows(s.a[k - 1], batch);
    const Bf16Matrix x16 = x_bf16 ? Bf16Matrix(first_rows(s.a16[k - 1], std::size_t(batch))) : Bf16Matrix();
    const MatrixU<T> dx = i > first_ ? rows(s.g[k - 1], batch)
                                     : (first_stage() ? MatrixU<T>() : rows(s.dinput, batch));
    if (hooks_) hooks_->before_backward(layer.unit());
    if (twice) {
      if (x_bf16) layer.backward_bf16(exec, x16, g, d16, dx, part_.tensor_sum);
      else layer.backward_bf16(exec, x, g, d16, dx, part_.tensor_sum);
    } else if (x_bf16) {
      layer.backward_bf16(exec, x16, g, dx, part_.tensor_sum);
    } else {
      layer.backward(exec, x, g, dx, part_.tensor_sum);
    }
    if (hooks_) hooks_->after_backward(layer.unit());
  }
}

template <class T>
MatrixU<T> Mlp<T>::forward(const ExecSpace& exec, const MatrixU<const T>& x) {
  if (!first_stage() || !last_stage())
    throw std::logic_error("tessera::nn::Mlp::forward(x) needs the whole model");
  if (simple_slot_ >= 0) this->release(simple_slot_);
  simple_slot_ = -1;
  simple_slot_ = this->acquire(static_cast<int>(x.extent(0)));
  simple_batch_ = static_cast<int>(x.extent(0));
  Kokkos::deep_copy(exec, input(simple_slot_), x);
  forward(exec, simple_slot_);
  return output(simple_slot_);
}

template <class T>
void Mlp<T>::backward(const ExecSpace& exec, const MatrixU<const T>& dlogits) {
  if (simple_slot_ < 0 || static_cast<int>(dlogits.extent(0)) != simple_batch_)
    throw std::invalid_argument(fmt::format("tessera::nn::Mlp::backward: dlogits has {} rows, the "
                                            "last forward {}", dlogits.extent(0), simple_batch_));
  Kokkos::deep_copy(exec, grad_output(simple_slot_), dlogits);
  backward(exec, simple_slot_);
}

template class Mlp<float>;
template class Mlp<double>;

}  // namespace tessera::nn
