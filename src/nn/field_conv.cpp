#include "nn/field_conv.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <type_traits>

#include "blas/gemm.hpp"
#include "blas/onednn_conv.hpp"
#include "kernels/halo_conv.hpp"

namespace tessera::nn {

template <class T>
FieldConv<T>::FieldConv(ParamStore<T>& store, const std::string& prefix, const Shape& shape)
    : store_(&store), s_(shape) {
  if (s_.kernel < 1 || s_.kernel % 2 == 0)
    throw std::invalid_argument(fmt::format("tessera::nn::FieldConv {}: kernel {} must be odd", prefix, s_.kernel));
  if (s_.rows < pad())
    throw std::invalid_argument(fmt::format("tessera::nn::FieldConv {}: a block of {} rows is thinner than the "
                                            "halo of {} rows", prefix, s_.rows, pad()));
  if (s_.onednn && !std::is_same_v<T, float>)
    throw std::invalid_argument(fmt::format("tessera::nn::FieldConv {}: oneDNN convolutions are float only", prefix));
  conv_ = kernels::ConvShape{s_.in, s_.rows, s_.width, s_.kernel, pad()};
  store.begin_unit();
  unit_ = store.units() - 1;
  const double bound = 1.0 / std::sqrt(double(s_.in) * s_.kernel * s_.kernel);
  weight_ = store.add(prefix + ".weight", {s_.out, s_.in, s_.kernel, s_.kernel}, InitKind::uniform, bound);
  bias_ = store.add(prefix + ".bias", {s_.out}, InitKind::uniform, bound);
}

template <class T>
void FieldConv<T>::multiply_rows(const ExecSpace& exec, Index batch, const T* col, T* z, Index y0, Index y1) const {
  if (y1 <= y0) return;
  const Index rows = conv_.rows(), pos = conv_.positions(), out = s_.out, W = s_.width;
  const T* w = store_->value(weight_).data();
  for (Index b = 0; b < batch; ++b)
    blas::matmul(exec, s_.precision, blas::Op::N, blas::Op::N, int(out), int((y1 - y0) * W), int(rows), T(1), w,
                 int(rows), col + b * rows * pos + y0 * W, int(pos), T(1), z + b * out * pos + y0 * W, int(pos));
}

template <class T>
void FieldConv<T>::forward(const ExecSpace& exec, Index batch, const T* x, T* col, T* z, const HaloBuffers<T>& buf,
                           Halo<T>* halo, bool overlap) const {
  const Index P = pad(), H = s_.rows, W = s_.width, C = s_.in;
  const bool exchange = halo != nullptr && halo->size() > 1 && P > 0;
  // Pack and send: the first P rows up, the last P rows down.
  if (exchange) {
    if (halo->has_up()) kernels::pack_rows(exec, x, batch, C, H, W, Index(0), P, buf.send_up);
    if (halo->has_down()) kernels::pack_rows(exec, x, batch, C, H, W, H - P, P, buf.send_down);
    exec.fence();
    halo->start(buf.send_up, buf.send_down, buf.recv_up, buf.recv_down, std::size_t(batch * halo_size()));
    if (!overlap) halo->finish();
  }
  if (s_.onednn) {
    forward_onednn(exec, batch, x, col, z, buf, halo, exchange, overlap);
    return;
  }
  kernels::fill_channels(exec, store_->value(bias_), batch, Index(s_.out), conv_.positions(), z);
  // The interior rows read no halo: compute them while it travels.
  const Index lo = std::min(P, H), hi = std::max(lo, H - P);
  kernels::im2col_rows(exec, conv_, x, static_cast<const T*>(nullptr), static_cast<const T*>(nullptr), col,
                       batch, lo, hi);
  multiply_rows(exec, batch, col, z, lo, hi);
  if (exchange && overlap) {
    exec.fence();
    halo->finish();
  }
  // The boundary rows, from the halos (zeros at the field's edges).
  const T* top = exchange && halo->has_up() ? buf.recv_up : nullptr;
  const T* bottom = exchange && halo->has_down() ? buf.recv_down : nullptr;
  kernels::im2col_rows(exec, conv_, x, top, bottom, col, batch, Index(0), lo);
  kernels::im2col_rows(exec, conv_, x, top, bottom, col, batch, hi, H);
  multiply_rows(exec, batch, col, z, Index(0), lo);
  multiply_rows(exec, batch, col, z, hi, H);
}

template <class T>
void FieldConv<T>::backward(const ExecSpace& exec, Index batch, const T* dz, const T* col, T* dx, T* dcol,
                            const HaloBuffers<T>& buf, Halo<T>* halo, bool overlap) const {
  const Index P = pad(), H = s_.rows, W = s_.width, C = s_.in, out = s_.out;
  const Index rows = conv_.rows(), pos = conv_.positions();
  const bool exchange = dx != nullptr && halo != nullptr && halo->size() > 1 && P > 0;
  if (s_.onednn) {
    backward_onednn(exec, batch, dz, col, dx, dcol, buf, halo, exchange, overlap);
    return;
  }
  kernels::channel_sums(exec, dz, batch, out, pos, store_->grad(bias_));
  if (dx != nullptr) {
    // dcol_b = W^T dz_b; col2im gives the block's rows and the halo rows (the neighbours' rows).
    const T* w = store_->value(weight_).data();
    for (Index b = 0; b < batch; ++b)
      blas::matmul(exec, s_.precision, blas::Op::T, blas::Op::N, int(rows), int(pos), int(out), T(1), w, int(rows),
                   dz + b * out * pos, int(pos), T(0), dcol + b * rows * pos, int(pos));
    kernels::col2im_rows(exec, conv_, dcol, dx, exchange && halo->has_up() ? buf.send_up : nullptr,
                         exchange && halo->has_down() ? buf.send_down : nullptr, batch);
    if (exchange) {
      exec.fence();
      halo->start(buf.send_up, buf.send_down, buf.recv_up, buf.recv_down, std::size_t(batch * halo_size()));
      if (!overlap) halo->finish();
    }
  }
  // The weight gradient while the halo gradients travel.
  T* dw = store_->grad(weight_).data();
  for (Index b = 0; b < batch; ++b)
    blas::matmul(exec, s_.precision, blas::Op::N, blas::Op::T, int(out), int(rows), int(pos), T(1),
                 dz + b * out * pos, int(pos), col + b * rows * pos, int(pos), T(1), dw, int(rows));
  if (!exchange) return;
  if (overlap) {
    exec.fence();
    halo->finish();
  }
  // What the neighbours computed for this block's first and last rows.
  if (halo->has_up()) kernels::add_rows(exec, buf.recv_up, batch, C, H, W, Index(0), P, dx);
  if (halo->has_down()) kernels::add_rows(exec, buf.recv_down, batch, C, H, W, H - P, P, dx);
}

namespace {

/// A convolution of the rows [y0, y1) of the output block from an input of `rows` rows of planes
/// of `plane_x` rows (no row padding: the halo rows are in place), written into planes of
/// `plane_y` rows.
blas::onednn::Conv2dShape valid_rows(Index batch, int in, int out, int kernel, int width, Index rows, Index plane_x,
                                     Index plane_y, bool bf16) {
  blas::onednn::Conv2dShape c;
  c.bf16 = bf16;
  c.batch = int(batch);
  c.in = in;
  c.out = out;
  c.height = int(rows);
  c.width = width;
  c.kernel = kernel;
  c.pad_top = c.pad_bottom = 0;
  c.plane_rows_x = int(plane_x);
  c.plane_rows_y = int(plane_y);
  return c;
}

}  // namespace

template <class T>
void FieldConv<T>::forward_onednn(const ExecSpace& exec, Index batch, const T* x, T* ext, T* z,
                                  const HaloBuffers<T>& buf, Halo<T>* halo, bool exchange, bool overlap) const {
  if constexpr (std::is_same_v<T, float>) {
    const Index P = pad(), H = s_.rows, W = s_.width, C = s_.in, E = H + 2 * P;
    const float* w = store_->value(weight_).data();
    const float* b = store_->value(bias_).data();
    const auto valid = [&](Index rows, Index plane_x) {  // rows of the extended block into planes of H rows
      return valid_rows(batch, s_.in, s_.out, s_.kernel, s_.width, rows, plane_x, H, bf16());
    };
    // The block in the middle of the extended block, for the boundary rows and the weight gradient.
    kernels::place_rows(exec, x, batch, C, E, W, P, H, ext);
    // The interior rows [P, H - P) read the block only: compute them while the halo travels.
    const Index lo = std::min(P, H), hi = std::max(lo, H - P);
    const bool split = exchange && overlap;
    exec.fence();
    if (split && hi > lo) blas::onednn::conv_forward(valid(H, H), x, w, b, z + lo * W);
    if (split) halo->finish();
    // The halo rows above and below (zeros at the field's edges), then the boundary rows from them
    // (all rows in one convolution where nothing was in flight).
    kernels::place_rows(exec, exchange && halo->has_up() ? buf.recv_up : static_cast<const T*>(nullptr), batch, C, E,
                        W, Index(0), P, ext);
    kernels::place_rows(exec, exchange && halo->has_down() ? buf.recv_down : static_cast<const T*>(nullptr), batch, C,
                        E, W, H + P, P, ext);
    exec.fence();
    if (!split) {
      if (exchange) blas::onednn::conv_forward(valid(E, E), ext, w, b, z);
      else  // zeros beyond the block: a "same" convolution of the block itself
        blas::onednn::conv_forward(
            blas::onednn::Conv2dShape::same(int(batch), s_.in, s_.out, int(H), s_.width, s_.kernel, bf16()), x, w, b, z);
      return;
    }
    if (lo > 0) blas::onednn::conv_forward(valid(lo + 2 * P, E), ext, w, b, z);
    if (H > hi) blas::onednn::conv_forward(valid(H - hi + 2 * P, E), ext + hi * W, w, b, z + hi * W);
  } else {
    (void)exec, (void)batch, (void)x, (void)ext, (void)z, (void)buf, (void)halo, (void)exchange, (void)overlap;
    throw std::logic_error("tessera::nn::FieldConv: oneDNN convolutions are float only");
  }
}

template <class T>
void FieldConv<T>::backward_onednn(const ExecSpace& exec, Index batch, const T* dz, const T* ext, T* dx, T* dext,
                                   const HaloBuffers<T>& buf, Halo<T>* halo, bool exchange, bool overlap) const {
  if constexpr (std::is_same_v<T, float>) {
    const Index P = pad(), H = s_.rows, W = s_.width, C = s_.in, E = H + 2 * P;
    const auto whole = valid_rows(batch, s_.in, s_.out, s_.kernel, s_.width, E, E, H, bf16());
    exec.fence();
    if (dx != nullptr && !exchange) {  // no halo rows: the block's gradient directly
      blas::onednn::conv_backward_data(blas::onednn::Conv2dShape::same(int(batch), s_.in, s_.out, int(H), s_.width,
                                                                       s_.kernel, bf16()),
                                       dz, store_->value(weight_).data(), dx);
    } else if (dx != nullptr) {
      // The extended block's gradient: the block's rows, and the halo rows for the neighbours.
      blas::onednn::conv_backward_data(whole, dz, store_->value(weight_).data(), dext);
      kernels::pack_rows(exec, dext, batch, C, E, W, P, H, dx);
      if (halo->has_up()) kernels::pack_rows(exec, dext, batch, C, E, W, Index(0), P, buf.send_up);
      if (halo->has_down()) kernels::pack_rows(exec, dext, batch, C, E, W, H + P, P, buf.send_down);
      exec.fence();
      halo->start(buf.send_up, buf.send_down, buf.recv_up, buf.recv_down, std::size_t(batch * halo_size()));
      if (!overlap) halo->finish();
    }
    // The weight and bias gradients while the halo gradients travel.
    blas::onednn::conv_backward_weights(whole, ext, dz, store_->grad(weight_).data(), store_->grad(bias_).data());
    if (!exchange) return;
    if (overlap) halo->finish();
    if (halo->has_up()) kernels::add_rows(exec, buf.recv_up, batch, C, H, W, Index(0), P, dx);
    if (halo->has_down()) kernels::add_rows(exec, buf.recv_down, batch, C, H, W, H - P, P, dx);
  } else {
    (void)exec, (void)batch, (void)dz, (void)ext, (void)dx, (void)dext, (void)buf, (void)halo, (void)exchange,
        (void)overlap;
    throw std::logic_error("tessera::nn::FieldConv: oneDNN convolutions are float only");
  }
}

template class FieldConv<float>;
template class FieldConv<double>;

}  // namespace tessera::nn
