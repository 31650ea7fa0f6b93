#include "nn/cnn.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "blas/conv_library.hpp"
#include "blas/gemm.hpp"
#include "blas/onednn_conv.hpp"
#include "core/memory.hpp"
#include "kernels/activation.hpp"
#include "kernels/halo_conv.hpp"
#include "nn/mlp.hpp"

namespace tessera::nn {

namespace {

template <class T>
Matrix<T> alloc(const std::string& what, std::size_t r, std::size_t c) {
  return Matrix<T>(Kokkos::view_alloc(mem::label(mem::Category::act, "tessera::nn::Cnn::" + what),
                                      Kokkos::WithoutInitializing), r, c);
}

template <class T>
VectorU<T> flat_rows(const Matrix<T>& m, int batch) {
  return VectorU<T>(m.data(), static_cast<std::size_t>(batch) * m.extent(1));
}

blas::onednn::Conv2dShape onednn_shape(const kernels::ConvShape& in, int out, int batch, Precision p) {
  return blas::onednn::Conv2dShape::same(batch, int(in.channels), out, int(in.height), int(in.width), int(in.kernel),
                                         p == Precision::bf16);
}

}  // namespace

template <class T>
Cnn<T>::Cnn(ParamStore<T>& store, const CnnShape& shape, Part part)
    : shape_(shape), part_(std::move(part)), store_(&store) {
  if (shape_.kernel < 1 || shape_.kernel % 2 == 0)
    throw std::invalid_argument(fmt::format("tessera::nn::Cnn: kernel {} must be odd", shape_.kernel));
  if (part_.tp > 1 && !part_.tensor_sum)
    throw std::invalid_argument("tessera::nn::Cnn: tensor parallelism needs a tensor_sum");
  onednn_ = std::is_same_v<T, float> && blas::conv_path(part_.conv, part_.precision) == blas::ConvPath::onednn;
  int c = shape_.channels, h = shape_.height, w = shape_.width;
  const int k = shape_.kernel;
  for (std::size_t i = 0; i < shape_.conv.size(); ++i) {
    const int out = shape_.conv[i];
    store.begin_unit();
    Conv conv;
    conv.unit = store.units() - 1;
    conv.in = kernels::ConvShape{c, h, w, k, k / 2};
    conv.out = out;
    const double bound = 1.0 / std::sqrt(double(c * k * k));
    conv.weight = store.add(fmt::format("convs.{}.weight", i), {out, c, k, k}, InitKind::uniform, bound);
    conv.bias = store.add(fmt::format("convs.{}.bias", i), {out}, InitKind::uniform, bound);
    convs_.push_back(conv);
    c = out;
    h /= 2;
    w /= 2;
    if (h < 1 || w < 1)
      throw std::invalid_argument(fmt::format("tessera::nn::Cnn: a {}x{} image vanishes after {} 2x2 pools",
                                              shape_.height, shape_.width, i + 1));
  }
  std::vector<int> widths{c * h * w};
  widths.insert(widths.end(), shape_.hidden.begin(), shape_.hidden.end());
  widths.push_back(shape_.classes);
  const int n = static_cast<int>(widths.size()) - 1;
  typename Linear<T>::Options options;
  options.precision = part_.precision;
  for (int j = 0; j < n; ++j)
    fcs_.emplace_back(store, fmt::format("fc.{}", j), widths[std::size_t(j)], widths[std::size_t(j) + 1],
                      Mlp<T>::split_of(j, n, part_.tp), part_.tp, part_.t, options);
}

template <class T>
void Cnn<T>::add_slot() {
  const auto B = static_cast<std::size_t>(this->max_batch());
  Slot& s = slots_.emplace_back();
  s.input = alloc<T>("input", B, std::size_t(input_width()));
  std::size_t dz = 0, dcol = 0, dpool = 0;
  for (std::size_t i = 0; i < convs_.size(); ++i) {
    const Conv& c = convs_[i];
    const auto col_rows = std::size_t(c.in.rows()), pos = std::size_t(c.in.positions()), out = std::size_t(c.out);
    const auto pooled = out * std::size_t(c.in.height / 2) * std::size_t(c.in.width / 2);
    if (!onednn_) s.col.push_back(alloc<T>(fmt::format("convs.{}.col", i), B, col_rows * pos));
    s.z.push_back(alloc<T>(fmt::format("convs.{}.z", i), B, out * pos));
    s.pooled.push_back(alloc<T>(fmt::format("convs.{}.pooled", i), B, pooled));
    s.arg.emplace_back(Kokkos::view_alloc(mem::label(mem::Category::act, "tessera::nn::Cnn::arg"),
                                          Kokkos::WithoutInitializing), B, pooled);
    dz = std::max(dz, out * pos);
    if (!onednn_) dcol = std::max(dcol, col_rows * pos);
    dpool = std::max({dpool, pooled, std::size_t(c.in.channels * c.in.height * c.in.width)});
  }
  for (std::size_t j = 0; j < fcs_.size(); ++j) {
    const auto o = std::size_t(fcs_[j].out_features());
    s.fz.push_back(alloc<T>(fmt::format("fc.{}.z", j), B, o));
    s.fa.push_back(j + 1 < fcs_.size() ? alloc<T>(fmt::format("fc.{}.a", j), B, o) : Matrix<T>());
    s.fg.push_back(alloc<T>(fmt::format("fc.{}.grad", j), B, o));
  }
  if (slots_.size() == 1) {
    dpool = std::max(dpool, std::size_t(fcs_.front().in_features()));
    dz_ = alloc<T>("dz", B, std::max<std::size_t>(dz, 1));
    dcol_ = alloc<T>("dcol", B, std::max<std::size_t>(dcol, 1));
    dpool_ = alloc<T>("dpool", B, dpool);
  }
}

template <class T>
double Cnn<T>::activation_bytes(int max_batch, int slots) const {
  // What add_slot() allocates: the input; per conv block its columns (im2col only), z, the
  // pooled output and its argmax (int32); per linear layer z, the activation (not the last's)
  // and the gradient. Shared: dz, dcol and dpool at their largest.
  const double f = sizeof(T);
  const auto bytes = [&](std::size_t width, double size) { return mem::view_bytes(double(max_batch) * double(width), size); };
  double slot = bytes(std::size_t(input_width()), f);
  std::size_t dz = 0, dcol = 0, dpool = 0;
  for (const Conv& c : convs_) {
    const auto col_rows = std::size_t(c.in.rows()), pos = std::size_t(c.in.positions()), out = std::size_t(c.out);
    const auto pooled = out * std::size_t(c.in.height / 2) * std::size_t(c.in.width / 2);
    slot += (onednn_ ? 0.0 : bytes(col_rows * pos, f)) + bytes(out * pos, f) + bytes(pooled, f) +
            bytes(pooled, sizeof(std::int32_t));
    dz = std::max(dz, out * pos);
    if (!onednn_) dcol = std::max(dcol, col_rows * pos);
    dpool = std::max({dpool, pooled, std::size_t(c.in.channels * c.in.height * c.in.width)});
  }
  for (std::size_t j = 0; j < fcs_.size(); ++j)
    slot += bytes(std::size_t(fcs_[j].out_features()), f) * (j + 1 < fcs_.size() ? 3.0 : 2.0);
  dpool = std::max(dpool, std::size_t(fcs_.front().in_features()));
  const double shared = bytes(std::max<std::size_t>(dz, 1), f) + bytes(std::max<std::size_t>(dcol, 1), f) + bytes(dpool, f);
  return double(slots) * slot + shared;
}

template <class T>
void Cnn<T>::clear_slots() {
  slots_.clear();
  dz_ = dcol_ = dpool_ = Matrix<T>();
}

template <class T>
MatrixU<T> Cnn<T>::input(int slot) const { return rows(slots_[std::size_t(slot)].input, this->batch_of(slot)); }

template <class T>
MatrixU<T> Cnn<T>::output(int slot) const { return rows(slots_[std::size_t(slot)].fz.back(), this->batch_of(slot)); }

template <class T>
MatrixU<T> Cnn<T>::grad_output(int slot) const { return rows(slots_[std::size_t(slot)].fg.back(), this->batch_of(slot)); }

template <class T>
MatrixU<T> Cnn<T>::grad_input(int) const {
  throw std::logic_error("tessera::nn::Cnn::grad_input: the CNN is a single pipeline stage");
}

template <class T>
void Cnn<T>::forward(const ExecSpace& exec, int slot) {
  ScopedRegion region("tessera::nn::Cnn::forward");
  const int batch = this->batch_of(slot);
  const Slot& s = slots_[std::size_t(slot)];
  const T* x = s.input.data();
  for (std::size_t i = 0; i < convs_.size(); ++i) {
    const Conv& c = convs_[i];
    const Index out = c.out;
    if (hooks_) hooks_->before_forward(c.unit);
    conv_forward(exec, i, batch, x, s);
    T* z = s.z[i].data();
    if (hooks_) hooks_->after_forward(c.unit);
    // relu(maxpool(z)) = maxpool(relu(z)): pool first, then ReLU on the smaller tensor.
    kernels::maxpool2_forward(exec, Index(batch), out, c.in.height, c.in.width, z, s.pooled[i].data(),
                              s.arg[i].data());
    const VectorU<T> p = flat_rows(s.pooled[i], batch);
    kernels::relu_forward(exec, p, p);
    x = s.pooled[i].data();
  }
  MatrixU<const T> a(x, std::size_t(batch), std::size_t(fcs_.front().in_features()));
  for (std::size_t j = 0; j < fcs_.size(); ++j) {
    const Linear<T>& l = fcs_[j];
    const MatrixU<T> z = rows(s.fz[j], batch);
    if (hooks_) hooks_->before_forward(l.unit());
    l.forward(exec, a, z, part_.tensor_sum);
    if (hooks_) hooks_->after_forward(l.unit());
    if (j + 1 == fcs_.size()) break;
    const MatrixU<T> act = rows(s.fa[j], batch);
    kernels::relu_forward(exec, flat(z), flat(act));
    a = act;
  }
}

template <class T>
void Cnn<T>::backward(const ExecSpace& exec, int slot) {
  ScopedRegion region("tessera::nn::Cnn::backward");
  const int batch = this->batch_of(slot);
  const Slot& s = slots_[std::size_t(slot)];
  const std::size_t n = fcs_.size();
  for (std::size_t j = n; j-- > 0;) {
    const Linear<T>& l = fcs_[j];
    const MatrixU<T> g = rows(s.fg[j], batch);
    if (j + 1 < n) kernels::relu_backward(exec, flat(rows(s.fz[j], batch)), flat(g), flat(g));
    const MatrixU<const T> x = j > 0 ? MatrixU<const T>(rows(s.fa[j - 1], batch))
                                     : MatrixU<const T>(convs_.empty() ? s.input.data() : s.pooled.back().data(),
                                                        std::size_t(batch), std::size_t(l.in_features()));
    const bool input_grad = j > 0 || !convs_.empty();
    const MatrixU<T> dx = j > 0 ? rows(s.fg[j - 1], batch)
                                : (input_grad ? MatrixU<T>(dpool_.data(), std::size_t(batch), std::size_t(l.in_features()))
                                              : MatrixU<T>());
    if (hooks_) hooks_->before_backward(l.unit());
    l.backward(exec, x, g, dx, part_.tensor_sum);
    if (hooks_) hooks_->after_backward(l.unit());
  }
  // dpool_ now holds the gradient of the last block's (ReLU'd, pooled) output.
  for (std::size_t i = convs_.size(); i-- > 0;) {
    const Conv& c = convs_[i];
    const Index pos = c.in.positions(), out = c.out;
    const Index pooled = out * (c.in.height / 2) * (c.in.width / 2);
    const VectorU<T> dp(dpool_.data(), std::size_t(batch * pooled));
    kernels::relu_backward(exec, flat_rows(s.pooled[i], batch), dp, dp);
    T* dz = dz_.data();
    Kokkos::deep_copy(exec, VectorU<T>(dz, std::size_t(Index(batch) * out * pos)), T(0));  // odd edges
    kernels::maxpool2_backward(exec, Index(batch), out, c.in.height, c.in.width, dpool_.data(), s.arg[i].data(), dz);
    if (hooks_) hooks_->before_backward(c.unit);
    conv_backward(exec, i, batch, s);
    if (hooks_) hooks_->after_backward(c.unit);
  }
}

template <class T>
void Cnn<T>::conv_forward(const ExecSpace& exec, std::size_t i, int batch, const T* x, const Slot& s) const {
  const Conv& c = convs_[i];
  const Index rows_ = c.in.rows(), pos = c.in.positions(), out = c.out;
  T* z = s.z[i].data();
  const VectorU<T> bias = store_->value(c.bias);
  const T* wgt = store_->value(c.weight).data();
  if constexpr (std::is_same_v<T, float>) {
    if (onednn_) {
      exec.fence();  // x and the parameters written by kernels enqueued on exec
      blas::onednn::conv_forward(onednn_shape(c.in, c.out, batch, part_.precision), x, wgt, bias.data(), z);
      return;
    }
  }
  kernels::im2col(exec, c.in, x, s.col[i].data(), batch);
  // z = bias (per channel) + W col, sample by sample.
  kernels::fill_channels(exec, bias, Index(batch), out, pos, z);
  for (int b = 0; b < batch; ++b)
    blas::matmul(exec, part_.precision, blas::Op::N, blas::Op::N, int(out), int(pos), int(rows_), T(1), wgt,
                 int(rows_), s.col[i].data() + Index(b) * rows_ * pos, int(pos), T(1), z + Index(b) * out * pos,
                 int(pos));
}

template <class T>
void Cnn<T>::conv_backward(const ExecSpace& exec, std::size_t i, int batch, const Slot& s) {
  const Conv& c = convs_[i];
  const Index rows_ = c.in.rows(), pos = c.in.positions(), out = c.out;
  const T* dz = dz_.data();
  T* dw = store_->grad(c.weight).data();
  const T* wgt = store_->value(c.weight).data();
  if constexpr (std::is_same_v<T, float>) {
    if (onednn_) {
      // The block's input: the batch's images, or the previous block's pooled (ReLU'd) output.
      const T* x = i == 0 ? s.input.data() : s.pooled[i - 1].data();
      const auto shape = onednn_shape(c.in, c.out, batch, part_.precision);
      exec.fence();
      blas::onednn::conv_backward_weights(shape, x, dz, dw, store_->grad(c.bias).data());
      if (i > 0) blas::onednn::conv_backward_data(shape, dz, wgt, dpool_.data());
      return;
    }
  }
  // db[o] += sum over samples and positions of dz; dW += dz_b col_b^T sample by sample.
  kernels::channel_sums(exec, dz, Index(batch), out, pos, store_->grad(c.bias));
  for (int b = 0; b < batch; ++b)
    blas::matmul(exec, part_.precision, blas::Op::N, blas::Op::T, int(out), int(rows_), int(pos), T(1),
                 dz + Index(b) * out * pos, int(pos), s.col[i].data() + Index(b) * rows_ * pos, int(pos), T(1), dw,
                 int(rows_));
  if (i > 0) {  // the gradient of this block's input: dcol_b = W^T dz_b, then col2im
    for (int b = 0; b < batch; ++b)
      blas::matmul(exec, part_.precision, blas::Op::T, blas::Op::N, int(rows_), int(pos), int(out), T(1), wgt,
                   int(rows_), dz + Index(b) * out * pos, int(pos), T(0), dcol_.data() + Index(b) * rows_ * pos,
                   int(pos));
    kernels::col2im(exec, c.in, dcol_.data(), dpool_.data(), Index(batch));
  }
}

template class Cnn<float>;
template class Cnn<double>;

}  // namespace tessera::nn
