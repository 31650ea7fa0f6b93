#include "nn/unet.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "blas/conv_library.hpp"
#include "blas/gemm.hpp"
#include "core/memory.hpp"
#include "kernels/activation.hpp"
#include "kernels/conv2d.hpp"
#include "kernels/field_loss.hpp"
#include "kernels/halo_conv.hpp"
#include "kernels/upsample.hpp"

namespace tessera::nn {

namespace {

template <class T>
Matrix<T> alloc(const std::string& what, std::size_t r, std::size_t c) {
  return Matrix<T>(Kokkos::view_alloc(mem::label(mem::Category::act, "tessera::nn::UNet::" + what),
                                      Kokkos::WithoutInitializing), r, std::max<std::size_t>(c, 1));
}

template <class T>
VectorU<T> flat_rows(T* data, Index batch, Index width) {
  return VectorU<T>(data, std::size_t(batch * width));
}

// A small per-channel vector on the device: f(c) for c < n.
template <class T, class F>
Vector<T> channel_values(const std::string& what, int n, F f) {
  Vector<T> v(mem::label(mem::Category::act, "tessera::nn::UNet::" + what), std::size_t(n));
  const auto h = Kokkos::create_mirror_view(v);
  for (int c = 0; c < n; ++c) h(std::size_t(c)) = T(f(std::size_t(c)));
  Kokkos::deep_copy(v, h);
  return v;
}

}  // namespace

template <class T>
UNet<T>::UNet(ParamStore<T>& store, const UNetShape& shape, Part part)
    : shape_(shape), part_(std::move(part)), store_(&store) {
  const auto L = shape_.levels.size();
  if (L == 0) throw std::invalid_argument("tessera::nn::UNet: no levels");
  for (std::size_t l = 0; l + 1 < L; ++l)
    if (level_rows(l) % 2 != 0 || level_width(l) % 2 != 0)
      throw std::invalid_argument(fmt::format("tessera::nn::UNet: level {} holds {} x {} values per channel; "
                                              "2x2 pooling needs even sizes", l, level_rows(l), level_width(l)));
  const int k = shape_.kernel;
  const bool dnn = std::is_same_v<T, float> && blas::conv_path(part_.conv, part_.precision) == blas::ConvPath::onednn;
  const Precision pr = part_.precision;
  int in = shape_.in_channels;
  for (std::size_t l = 0; l < L; ++l) {
    const int c = shape_.levels[l], r = int(level_rows(l)), w = int(level_width(l));
    convs_.emplace_back(store, fmt::format("down.{}.conv1", l), typename FieldConv<T>::Shape{in, c, k, r, w, dnn, pr});
    convs_.emplace_back(store, fmt::format("down.{}.conv2", l), typename FieldConv<T>::Shape{c, c, k, r, w, dnn, pr});
    in = c;
  }
  ups_.resize(L - 1);
  for (std::size_t l = L - 1; l-- > 0;) {
    Up& u = ups_[l];
    u.in = shape_.levels[l + 1];
    u.out = shape_.levels[l];
    u.rows = int(level_rows(l + 1));
    u.width = int(level_width(l + 1));
    store.begin_unit();
    u.unit = store.units() - 1;
    const double bound = 1.0 / std::sqrt(4.0 * u.out);  // nn.ConvTranspose2d: fan_in from dimension 1
    u.weight = store.add(fmt::format("up.{}.upconv.weight", l), {u.in, u.out, 2, 2}, InitKind::uniform, bound);
    u.bias = store.add(fmt::format("up.{}.upconv.bias", l), {u.out}, InitKind::uniform, bound);
    const int c = u.out, r = int(level_rows(l)), w = int(level_width(l));
    u.conv1 = convs_.size();
    convs_.emplace_back(store, fmt::format("up.{}.conv1", l), typename FieldConv<T>::Shape{2 * c, c, k, r, w, dnn, pr});
    u.conv2 = convs_.size();
    convs_.emplace_back(store, fmt::format("up.{}.conv2", l), typename FieldConv<T>::Shape{c, c, k, r, w, dnn, pr});
  }
  const FieldNorm& n = shape_.norm;
  if (!n.empty() && (n.in_mean.size() != std::size_t(shape_.in_channels) || n.in_std.size() != n.in_mean.size() ||
                     n.out_mean.size() != std::size_t(shape_.out_channels) || n.out_std.size() != n.out_mean.size()))
    throw std::invalid_argument("tessera::nn::UNet: a FieldNorm needs one mean and std per input and output channel");
  const bool id = n.empty();
  in_scale_ = channel_values<T>("in_scale", shape_.in_channels, [&](std::size_t c) { return id ? 1.0 : 1.0 / n.in_std[c]; });
  in_shift_ = channel_values<T>("in_shift", shape_.in_channels,
                                [&](std::size_t c) { return id ? 0.0 : -n.in_mean[c] / n.in_std[c]; });
  out_std_ = channel_values<T>("out_std", shape_.out_channels, [&](std::size_t c) { return id ? 1.0 : n.out_std[c]; });
  out_mean_ = channel_values<T>("out_mean", shape_.out_channels, [&](std::size_t c) { return id ? 0.0 : n.out_mean[c]; });
  out_inv_ = channel_values<T>("out_inv", shape_.out_channels, [&](std::size_t c) { return id ? 1.0 : 1.0 / n.out_std[c]; });
  store.begin_unit();
  head_unit_ = store.units() - 1;
  const double bound = 1.0 / std::sqrt(double(shape_.levels[0]));
  head_weight_ = store.add("head.weight", {shape_.out_channels, shape_.levels[0], 1, 1}, InitKind::uniform, bound);
  head_bias_ = store.add("head.bias", {shape_.out_channels}, InitKind::uniform, bound);
}

template <class T>
Index UNet<T>::largest_activation() const {
  Index n = Index(shape_.out_channels) * level_rows(0) * level_width(0);
  for (const auto& c : convs_) n = std::max({n, c.in_size(), c.out_size()});
  return n;
}

template <class T>
Index UNet<T>::largest_col() const {
  Index n = 1;
  for (const auto& c : convs_) n = std::max(n, c.col_size());
  return n;
}

template <class T>
Index UNet<T>::largest_halo() const {
  Index n = 1;
  for (const auto& c : convs_) n = std::max(n, c.halo_size());
  return n;
}

template <class T>
double UNet<T>::activation_bytes(int max_batch, int slots) const {
  // What add_slot() allocates. A slot: the input (and its standardised copy), each convolution's
  // columns, pre-activation and activation, each pooled level (values and int32 argmax), each
  // concatenation, the output and its gradient.
  const auto L = shape_.levels.size();
  const double f = sizeof(T);
  const auto bytes = [&](double width, double size) { return mem::view_bytes(double(max_batch) * width, size); };
  double slot = bytes(input_width(), f) * (shape_.norm.empty() ? 1.0 : 2.0) + 2 * bytes(output_width(), f);
  for (const auto& c : convs_) slot += bytes(double(c.col_size()), f) + 2 * bytes(double(c.out_size()), f);
  for (std::size_t l = 0; l + 1 < L; ++l) {
    const double pooled = double(level_size(l) / 4);
    slot += bytes(pooled, f) + bytes(pooled, sizeof(std::int32_t)) + bytes(2.0 * double(level_size(l)), f);
  }
  // Shared: two gradient buffers, a column matrix, four rows of halo per sample, the skip
  // gradients, the up-sampling product, the loss's three sums (double).
  double shared = 2 * bytes(double(largest_activation()), f) + bytes(double(largest_col()), f) +
                  bytes(4.0 * double(largest_halo()), f) + bytes(3.0, sizeof(double));
  Index yp = 1;
  for (std::size_t l = 0; l + 1 < L; ++l) {
    yp = std::max(yp, level_size(l));
    shared += bytes(double(level_size(l)), f);
  }
  shared += bytes(double(yp), f);
  return double(slots) * slot + shared;
}

template <class T>
void UNet<T>::add_slot() {
  const auto B = static_cast<std::size_t>(this->max_batch());
  const auto L = shape_.levels.size();
  Slot& s = slots_.emplace_back();
  s.input = alloc<T>("input", B, std::size_t(input_width()));
  if (!shape_.norm.empty()) s.std_input = alloc<T>("std_input", B, std::size_t(input_width()));
  s.out = alloc<T>("out", B, std::size_t(output_width()));
  s.gout = alloc<T>("grad_out", B, std::size_t(output_width()));
  for (std::size_t i = 0; i < convs_.size(); ++i) {
    s.col.push_back(alloc<T>("col", B, std::size_t(convs_[i].col_size())));
    s.z.push_back(alloc<T>("z", B, std::size_t(convs_[i].out_size())));
    s.a.push_back(alloc<T>("a", B, std::size_t(convs_[i].out_size())));
  }
  for (std::size_t l = 0; l + 1 < L; ++l) {
    const auto pooled = std::size_t(level_size(l) / 4);
    s.pooled.push_back(alloc<T>("pooled", B, pooled));
    s.arg.emplace_back(Kokkos::view_alloc(mem::label(mem::Category::act, "tessera::nn::UNet::arg"),
                                          Kokkos::WithoutInitializing), B, pooled);
    s.cat.push_back(alloc<T>("cat", B, std::size_t(2 * level_size(l))));
  }
  if (slots_.size() > 1) return;
  ga_ = alloc<T>("grad_a", B, std::size_t(largest_activation()));
  gb_ = alloc<T>("grad_b", B, std::size_t(largest_activation()));
  dcol_ = alloc<T>("dcol", B, std::size_t(largest_col()));
  halo_ = alloc<T>("halo", 4 * B, std::size_t(largest_halo()));
  Index yp = 1;
  for (std::size_t l = 0; l + 1 < L; ++l) {
    dskip_.push_back(alloc<T>("dskip", B, std::size_t(level_size(l))));
    yp = std::max(yp, level_size(l));
  }
  yp_ = alloc<T>("upsample", B, std::size_t(yp));
  sums_ = decltype(sums_)(mem::label(mem::Category::act, "tessera::nn::UNet::loss_sums"), B, 3);
}

template <class T>
void UNet<T>::clear_slots() {
  slots_.clear();
  ga_ = gb_ = yp_ = dcol_ = halo_ = Matrix<T>();
  dskip_.clear();
  sums_ = decltype(sums_)();
}

template <class T>
HaloBuffers<T> UNet<T>::halo_buffers() const {
  const std::size_t n = halo_.extent(0) / 4 * halo_.extent(1);
  T* base = halo_.data();
  return {base, base + n, base + 2 * n, base + 3 * n};
}

template <class T>
MatrixU<T> UNet<T>::input(int slot) const { return rows(slots_[std::size_t(slot)].input, this->batch_of(slot)); }

template <class T>
MatrixU<T> UNet<T>::output(int slot) const { return rows(slots_[std::size_t(slot)].out, this->batch_of(slot)); }

template <class T>
MatrixU<T> UNet<T>::grad_output(int slot) const { return rows(slots_[std::size_t(slot)].gout, this->batch_of(slot)); }

template <class T>
MatrixU<T> UNet<T>::grad_input(int) const {
  throw std::logic_error("tessera::nn::UNet::grad_input: the U-Net is a single pipeline stage");
}

template <class T>
void UNet<T>::run_conv(const ExecSpace& exec, std::size_t i, Index batch, const T* x, Slot& s) {
  const FieldConv<T>& c = convs_[i];
  if (hooks_) hooks_->before_forward(c.unit());
  c.forward(exec, batch, x, s.col[i].data(), s.z[i].data(), halo_buffers(), part_.halo.get(), part_.overlap);
  if (hooks_) hooks_->after_forward(c.unit());
  const auto z = flat_rows(s.z[i].data(), batch, c.out_size());
  const auto a = flat_rows(s.a[i].data(), batch, c.out_size());
  if (shape_.activation == Activation::gelu) kernels::gelu_forward(exec, z, a);
  else kernels::relu_forward(exec, z, a);
}

template <class T>
void UNet<T>::back_conv(const ExecSpace& exec, std::size_t i, Index batch, T* g, T* dx, Slot& s) {
  const FieldConv<T>& c = convs_[i];
  const auto z = flat_rows(s.z[i].data(), batch, c.out_size());
  const auto dz = flat_rows(g, batch, c.out_size());
  if (shape_.activation == Activation::gelu) kernels::gelu_backward(exec, z, dz, dz);
  else kernels::relu_backward(exec, z, dz, dz);
  if (hooks_) hooks_->before_backward(c.unit());
  c.backward(exec, batch, g, s.col[i].data(), dx, dcol_.data(), halo_buffers(), part_.halo.get(), part_.overlap);
  if (hooks_) hooks_->after_backward(c.unit());
}

template <class T>
void UNet<T>::up_forward(const ExecSpace& exec, std::size_t l, Index batch, const T* x, Slot& s) {
  // yp_b (out*4, rows*width) = w^T x_b, w as the matrix [in, out*4]; scattered into the first
  // `out` channels of the concatenation, the skip s_l into the rest.
  const Up& u = ups_[l];
  const Index hw = Index(u.rows) * u.width, m = Index(u.out) * 4, cat = 2 * level_size(l);
  if (hooks_) hooks_->before_forward(u.unit);
  const T* w = store_->value(u.weight).data();
  for (Index b = 0; b < batch; ++b)
    blas::matmul(exec, part_.precision, blas::Op::T, blas::Op::N, int(m), int(hw), u.in, T(1), w, int(m),
                 x + b * u.in * hw, int(hw), T(0), yp_.data() + b * m * hw, int(hw));
  kernels::upsample2_scatter(exec, yp_.data(), store_->value(u.bias), batch, Index(u.out), Index(u.rows),
                             Index(u.width), s.cat[l].data(), cat);
  if (hooks_) hooks_->after_forward(u.unit);
  kernels::copy_samples(exec, static_cast<const T*>(s.a[2 * l + 1].data()), level_size(l),
                        s.cat[l].data() + level_size(l), cat, batch, level_size(l));
}

template <class T>
void UNet<T>::up_backward(const ExecSpace& exec, std::size_t l, Index batch, const T* x, const T* dcat, T* dx) {
  const Up& u = ups_[l];
  const Index hw = Index(u.rows) * u.width, m = Index(u.out) * 4, cat = 2 * level_size(l);
  if (hooks_) hooks_->before_backward(u.unit);
  // dyp from the first `out` channels of the concatenation's gradient; each channel's 4 rows of
  // dyp are contiguous, so its bias gradient is a channel sum over 4*hw values.
  kernels::upsample2_gather(exec, dcat, cat, batch, Index(u.out), Index(u.rows), Index(u.width), yp_.data());
  kernels::channel_sums(exec, static_cast<const T*>(yp_.data()), batch, Index(u.out), 4 * hw, store_->grad(u.bias));
  T* dw = store_->grad(u.weight).data();
  const T* w = store_->value(u.weight).data();
  for (Index b = 0; b < batch; ++b) {
    // dw [in, out*4] += x_b dyp_b^T; dx_b = w dyp_b.
    blas::matmul(exec, part_.precision, blas::Op::N, blas::Op::T, u.in, int(m), int(hw), T(1), x + b * u.in * hw,
                 int(hw), yp_.data() + b * m * hw, int(hw), T(1), dw, int(m));
    blas::matmul(exec, part_.precision, blas::Op::N, blas::Op::N, u.in, int(hw), int(m), T(1), w, int(m),
                 yp_.data() + b * m * hw, int(hw), T(0), dx + b * u.in * hw, int(hw));
  }
  if (hooks_) hooks_->after_backward(u.unit);
}

template <class T>
void UNet<T>::head_forward(const ExecSpace& exec, Index batch, const T* x, T* out) {
  const Index c = shape_.levels[0], o = shape_.out_channels, pos = level_rows(0) * level_width(0);
  if (hooks_) hooks_->before_forward(head_unit_);
  kernels::fill_channels(exec, store_->value(head_bias_), batch, o, pos, out);
  const T* w = store_->value(head_weight_).data();
  for (Index b = 0; b < batch; ++b)
    blas::matmul(exec, part_.precision, blas::Op::N, blas::Op::N, int(o), int(pos), int(c), T(1), w, int(c),
                 x + b * c * pos, int(pos), T(1), out + b * o * pos, int(pos));
  if (hooks_) hooks_->after_forward(head_unit_);
}

template <class T>
void UNet<T>::head_backward(const ExecSpace& exec, Index batch, const T* x, const T* g, T* dx) {
  const Index c = shape_.levels[0], o = shape_.out_channels, pos = level_rows(0) * level_width(0);
  if (hooks_) hooks_->before_backward(head_unit_);
  kernels::channel_sums(exec, g, batch, o, pos, store_->grad(head_bias_));
  T* dw = store_->grad(head_weight_).data();
  const T* w = store_->value(head_weight_).data();
  for (Index b = 0; b < batch; ++b) {
    blas::matmul(exec, part_.precision, blas::Op::N, blas::Op::T, int(o), int(c), int(pos), T(1), g + b * o * pos,
                 int(pos), x + b * c * pos, int(pos), T(1), dw, int(c));
    blas::matmul(exec, part_.precision, blas::Op::T, blas::Op::N, int(c), int(pos), int(o), T(1), w, int(c),
                 g + b * o * pos, int(pos), T(0), dx + b * c * pos, int(pos));
  }
  if (hooks_) hooks_->after_backward(head_unit_);
}

template <class T>
void UNet<T>::forward(const ExecSpace& exec, int slot) {
  ScopedRegion region("tessera::nn::UNet::forward");
  const Index batch = this->batch_of(slot);
  Slot& s = slots_[std::size_t(slot)];
  const auto L = shape_.levels.size();
  const T* x = s.input.data();
  const Index positions = level_rows(0) * level_width(0);
  if (!shape_.norm.empty()) {  // the standardised copy of the input
    Kokkos::deep_copy(exec, rows(s.std_input, int(batch)), rows(s.input, int(batch)));
    kernels::affine_channels(exec, in_scale_, in_shift_, batch, Index(shape_.in_channels), positions,
                             s.std_input.data());
    x = s.std_input.data();
  }
  for (std::size_t l = 0; l < L; ++l) {
    run_conv(exec, 2 * l, batch, x, s);
    run_conv(exec, 2 * l + 1, batch, s.a[2 * l].data(), s);
    x = s.a[2 * l + 1].data();
    if (l + 1 == L) break;
    kernels::maxpool2_forward(exec, batch, Index(shape_.levels[l]), level_rows(l), level_width(l), x,
                              s.pooled[l].data(), s.arg[l].data());
    x = s.pooled[l].data();
  }
  for (std::size_t l = L - 1; l-- > 0;) {
    up_forward(exec, l, batch, x, s);
    run_conv(exec, ups_[l].conv1, batch, s.cat[l].data(), s);
    run_conv(exec, ups_[l].conv2, batch, s.a[ups_[l].conv1].data(), s);
    x = s.a[ups_[l].conv2].data();
  }
  head_forward(exec, batch, x, s.out.data());
  if (!shape_.norm.empty())
    kernels::affine_channels(exec, out_std_, out_mean_, batch, Index(shape_.out_channels), positions, s.out.data());
}

template <class T>
void UNet<T>::backward(const ExecSpace& exec, int slot) {
  ScopedRegion region("tessera::nn::UNet::backward");
  const Index batch = this->batch_of(slot);
  Slot& s = slots_[std::size_t(slot)];
  const auto L = shape_.levels.size();
  // The gradient being carried back and the buffer the next one goes to.
  T* g = ga_.data();
  T* next = gb_.data();
  const std::size_t last = L > 1 ? ups_[0].conv2 : 2 * L - 1;
  head_backward(exec, batch, s.a[last].data(), s.gout.data(), g);
  for (std::size_t l = 0; l + 1 < L; ++l) {
    const Up& u = ups_[l];
    back_conv(exec, u.conv2, batch, g, next, s);
    std::swap(g, next);
    back_conv(exec, u.conv1, batch, g, next, s);  // next: the concatenation's gradient
    std::swap(g, next);
    kernels::copy_samples(exec, static_cast<const T*>(g + level_size(l)), 2 * level_size(l), dskip_[l].data(),
                          level_size(l), batch, level_size(l));
    const T* x = l + 2 == L ? s.a[2 * L - 1].data() : s.a[ups_[l + 1].conv2].data();
    up_backward(exec, l, batch, x, g, next);
    std::swap(g, next);
  }
  // g: the gradient of the bottom level's output. Down the encoder.
  for (std::size_t l = L; l-- > 0;) {
    if (l + 1 < L) {  // g is the gradient of pooled_l: through the pool, plus the skip's
      kernels::maxpool2_backward(exec, batch, Index(shape_.levels[l]), level_rows(l), level_width(l), g,
                                 s.arg[l].data(), next);
      kernels::copy_samples(exec, static_cast<const T*>(dskip_[l].data()), level_size(l), next, level_size(l), batch,
                            level_size(l), true);
      std::swap(g, next);
    }
    back_conv(exec, 2 * l + 1, batch, g, next, s);
    std::swap(g, next);
    back_conv(exec, 2 * l, batch, g, l > 0 ? next : nullptr, s);
    std::swap(g, next);
  }
}

template <class T>
LossSums UNet<T>::loss(const ExecSpace& exec, int slot, VectorU<const std::int32_t>, MatrixU<const T> targets,
                       T scale) {
  const Index batch = this->batch_of(slot);
  const Slot& s = slots_[std::size_t(slot)];
  const double count = double(shape_.out_channels) * shape_.field_height * shape_.width;
  const auto sums = Kokkos::subview(sums_, std::make_pair<std::size_t>(0, std::size_t(batch)), Kokkos::ALL);
  // gout: the gradient of the head's output (the standardised field under FieldNorm).
  kernels::field_errors(exec, MatrixU<const T>(rows(s.out, int(batch))), targets, count, scale, out_inv_,
                        level_rows(0) * level_width(0), rows(s.gout, int(batch)), sums);
  std::vector<double> h(std::size_t(3 * batch));
  Kokkos::deep_copy(exec, Kokkos::View<double**, Kokkos::LayoutRight, HostSpace, Kokkos::MemoryUnmanaged>(
                              h.data(), std::size_t(batch), 3), sums);
  exec.fence();
  if (part_.halo && part_.halo->size() > 1) part_.halo->sum(h.data(), h.size());
  LossSums r;
  if (part_.halo && part_.halo->rank() != 0) return r;  // counted once per sample
  for (Index b = 0; b < batch; ++b) {
    const double err = h[std::size_t(3 * b)], ref = h[std::size_t(3 * b + 1)];
    r.loss += h[std::size_t(3 * b + 2)] / count;
    r.rel_l2 += std::sqrt(err) / std::max(std::sqrt(ref), 1e-30);
  }
  return r;
}

template class UNet<float>;
template class UNet<double>;

}  // namespace tessera::nn
