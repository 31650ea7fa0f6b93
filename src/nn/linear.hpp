#pragma once
// Fully connected layer y = x W^T + b, as PyTorch's nn.Linear: weight [out, in] row-major,
// bias [out], both initialised U(-1/sqrt(in), 1/sqrt(in)).
#include <cmath>
#include <string>

#include "blas/gemm.hpp"
#include "kernels/bias.hpp"
#include "kernels/views.hpp"
#include "nn/param_store.hpp"

namespace tessera::nn {

template <class T>
class Linear {
 public:
  /// \brief Registers `<prefix>.weight` [out, in] and `<prefix>.bias` [out] in `store`, as a
  /// unit of their own (before store.plan()).
  Linear(ParamStore<T>& store, const std::string& prefix, int in, int out)
      : store_(&store), in_(in), out_(out) {
    store.begin_unit();
    unit_ = store.units() - 1;
    const double bound = 1.0 / std::sqrt(double(in));
    weight_ = store.add(prefix + ".weight", {out, in}, InitKind::uniform, bound);
    bias_ = store.add(prefix + ".bias", {out}, InitKind::uniform, bound);
  }

  int in_features() const { return in_; }
  int out_features() const { return out_; }
  std::size_t weight_index() const { return weight_; }
  std::size_t bias_index() const { return bias_; }
  /// The store's unit holding this layer's parameters.
  std::size_t unit() const { return unit_; }

  /// \brief y = x W^T + b.  x (B,in), y (B,out); rows may be strided (stride_0 >= extent 1).
  void forward(const ExecSpace& exec, const MatrixU<const T>& x, const MatrixU<T>& y) const {
    const int batch = int(x.extent(0));
    check_shape("forward: x", x, batch, in_);
    check_shape("forward: y", y, batch, out_);
    const MatrixU<T> w = store_->value_matrix(weight_);
    // Bias into every row of y, then y += x W^T.
    kernels::bias_broadcast(exec, store_->value(bias_), y);
    blas::gemm(exec, blas::Op::N, blas::Op::T, batch, out_, in_, T(1), x.data(), ld(x), w.data(),
               in_, T(1), y.data(), ld(y));
  }

  /// \brief dW += dy^T x, db += colsum(dy) (both accumulate, for micro-batches), and
  /// dx = dy W when dx is not empty (dx is overwritten).  x (B,in), dy (B,out), dx (B,in).
  void backward(const ExecSpace& exec, const MatrixU<const T>& x, const MatrixU<const T>& dy,
                const MatrixU<T>& dx) const {
    const int batch = int(x.extent(0));
    check_shape("backward: x", x, batch, in_);
    check_shape("backward: dy", dy, batch, out_);
    const MatrixU<T> dw = store_->grad_matrix(weight_);
    blas::gemm(exec, blas::Op::T, blas::Op::N, out_, in_, batch, T(1), dy.data(), ld(dy),
               x.data(), ld(x), T(1), dw.data(), in_);
    kernels::bias_backward(exec, dy, store_->grad(bias_));
    if (dx.data() != nullptr) {
      check_shape("backward: dx", dx, batch, in_);
      const MatrixU<T> w = store_->value_matrix(weight_);
      blas::gemm(exec, blas::Op::N, blas::Op::N, batch, in_, out_, T(1), dy.data(), ld(dy),
                 w.data(), in_, T(0), dx.data(), ld(dx));
    }
  }

 private:
  template <class View>
  static int ld(const View& m) {
    return int(m.stride_0()) > 0 ? int(m.stride_0()) : 1;
  }

  template <class View>
  static void check_shape(const char* what, const View& m, int rows, int cols) {
    if (int(m.extent(0)) != rows || int(m.extent(1)) != cols) {
      throw std::invalid_argument(std::string("tessera::nn::Linear::") + what + " is (" +
                                  std::to_string(m.extent(0)) + "," + std::to_string(m.extent(1)) +
                                  "), expected (" + std::to_string(rows) + "," +
                                  std::to_string(cols) + ")");
    }
  }

  ParamStore<T>* store_;
  int in_;
  int out_;
  std::size_t weight_ = 0;
  std::size_t bias_ = 0;
  std::size_t unit_ = 0;
};

}  // namespace tessera::nn
