#pragma once
// Fully connected layer y = x W^T + b, as PyTorch's nn.Linear: weight [out, in] row-major,
// bias [out], both initialised U(-1/sqrt(in), 1/sqrt(in)).
//
// Tensor parallelism (Megatron): a column-parallel layer holds rows [t*out/tp, (t+1)*out/tp) of
// the weight and of the bias (its output is split over the tensor ranks, its input whole); a
// row-parallel layer holds columns [t*in/tp, (t+1)*in/tp) of the weight and the whole bias (its
// input is split, its output a partial sum that the caller sums over the tensor group before
// add_bias()). The layer does no communication itself.
//
// A fused projection of `groups` outputs (attention's q, k and v: groups = 3) keeps its weight
// as [groups, out/groups, in] and bias [groups, out/groups]; column parallelism then gives each
// tensor rank the same rows of every group, so its local (out/tp, in) block holds its heads'
// q, k and v one after another.
#include <cmath>
#include <cstdint>
#include <functional>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "blas/gemm.hpp"
#include "kernels/bias.hpp"
#include "kernels/views.hpp"
#include "nn/param_store.hpp"

namespace tessera::nn {

enum class Split { none, column, row };

/// \brief True where the products of a model on `store`, in precision p (the model's, from
/// train.precision), read its weights' bf16 copies (ParamStore::bf16_value, made once per change
/// of the values) instead of converting the fp32 weights at each product: they take bf16 operands
/// (blas::bf16_operands(p): bf16 on a host bf16 GEMM) and the store holds full values (ZeRO-3
/// gathers them per use and keeps the conversion in the product).
template <class T>
bool bf16_weights(const ParamStore<T>& store, Precision p) {
  return std::is_same_v<T, float> && store.storage().full_values && blas::bf16_operands(p);
}

/// \brief True where a model of element type T whose products compute in precision p keeps in
/// bf16 the activations that only products read (the GPT, the MLP): float models whose products
/// take bf16 operands. Decided with a model's first slot; checked_bf16_activations() checks it at
/// each use.
template <class T>
bool bf16_activations(Precision p) {
  return std::is_same_v<T, float> && blas::bf16_operands(p);
}

/// \brief `kept` (whether the slots of `model`, of precision p, hold bf16 activations), after
/// checking that its products still take bf16 operands: std::logic_error naming the model where
/// the host's bf16 GEMM went away after the slots were made (blas::set_gemm_library,
/// blas::cblas::set_sbgemm).
inline bool checked_bf16_activations(bool kept, Precision p, const char* model) {
  if (kept && !blas::bf16_operands(p))
    throw std::logic_error(std::string("tessera::nn::") + model +
                           ": the slots hold bf16 activations, but the products no longer take bf16 operands "
                           "(the host's bf16 GEMM changed after they were made)");
  return kept;
}

/// A bf16 activation (bit patterns, kernels/precision.hpp): a matrix that a kernel wrote in
/// bf16 for the products that read it.
using Bf16Matrix = MatrixU<const std::uint16_t>;

template <class T>
class Linear {
 public:
  /// \brief Registers `<prefix>.weight` [out, in] and `<prefix>.bias` [out] in `store` (this
  /// rank's blocks of them under a split over tp tensor ranks, t being this one), as a unit of
  /// their own (before store.plan()). in and out are the logical widths; the split one must be
  /// divisible by tp.
  /// How a layer is initialised and grouped, and the precision of its products (the defaults:
  /// PyTorch's nn.Linear, a unit of its own, fp32).
  struct Options {
    int groups = 1;             ///< fused outputs (see above); out divisible by groups * tp
    bool own_unit = true;       ///< false: the caller began the unit (a transformer block)
    InitKind weight_init = InitKind::uniform;
    double weight_bound = 0.0;  ///< uniform bound or normal std; 0: 1/sqrt(in), uniform
    bool zero_bias = false;     ///< biases start at zero (else U(-1/sqrt(in), 1/sqrt(in)))
    Precision precision = Precision::fp32;  ///< of every product (train.precision; float layers)
    bool bias = true;           ///< false: no bias parameter (the Llama family's layers)
  };

  /// \brief Registers `<prefix>.weight` [out, in] and `<prefix>.bias` [out] in `store` (this
  /// rank's blocks of them under a split over tp tensor ranks, t being this one), as a unit of
  /// their own unless options say otherwise (before store.plan()). in and out are the logical
  /// widths; the split one must be divisible by tp.
  Linear(ParamStore<T>& store, const std::string& prefix, int in, int out, Split split = Split::none,
         int tp = 1, int t = 0, Options options = {})
      : store_(&store), split_(tp > 1 ? split : Split::none), precision_(options.precision),
        in_(split_ == Split::row ? in / tp : in), out_(split_ == Split::column ? out / tp : out) {
    const int groups = options.groups;
    if ((split_ == Split::row && in % tp) || (split_ == Split::column && out % (tp * groups)) ||
        out % groups)
      throw std::invalid_argument(prefix + ": the split width is not divisible by the tensor ranks");
    if (options.own_unit) store.begin_unit();
    unit_ = store.units() - 1;
    const double bound = 1.0 / std::sqrt(double(in));
    const InitKind w_init = options.weight_bound > 0 ? options.weight_init : InitKind::uniform;
    const double w_bound = options.weight_bound > 0 ? options.weight_bound : bound;
    const InitKind b_init = options.zero_bias ? InitKind::zeros : InitKind::uniform;
    const std::int64_t row0 = split_ == Split::column ? std::int64_t(t) * out_ / groups : 0;
    if (groups == 1) {
      Placement w{{out, in}, {row0, split_ == Split::row ? std::int64_t(t) * in_ : 0},
                  split_ != Split::none};
      Placement b{{out}, {row0}, split_ == Split::column};
      weight_ = store.add(prefix + ".weight", {out_, in_}, w_init, w_bound, w);
      if (options.bias) bias_ = store.add(prefix + ".bias", {out_}, b_init, bound, b);
    } else {
      if (!options.bias) throw std::invalid_argument(prefix + ": a fused projection without a bias");
      Placement w{{groups, out / groups, in}, {0, row0, 0}, split_ != Split::none};
      Placement b{{groups, out / groups}, {0, row0}, split_ == Split::column};
      weight_ = store.add(prefix + ".weight", {groups, out_ / groups, in_}, w_init, w_bound, w);
      bias_ = store.add(prefix + ".bias", {groups, out_ / groups}, b_init, bound, b);
    }
  }

  /// This rank's widths (the split one divided by tp).
  int in_features() const { return in_; }
  int out_features() const { return out_; }
  Split split() const { return split_; }
  /// The precision of the layer's products (blas::matmul).
  Precision precision() const { return precision_; }
  std::size_t weight_index() const { return weight_; }
  /// The bias's index in the store; no_bias where the layer has none (Options::bias).
  std::size_t bias_index() const { return bias_; }
  bool has_bias() const { return bias_ != no_bias; }
  static constexpr std::size_t no_bias = static_cast<std::size_t>(-1);
  /// The store's unit holding this layer's parameters.
  std::size_t unit() const { return unit_; }

  /// Who applies the bias: the layer (forward adds it, backward sums dy's columns into its
  /// gradient), or the caller, fused into the kernel that reads the product (forward) or makes
  /// dy (backward), which saves a pass over the output.
  enum class Bias { layer, caller };

  /// \brief y = x W^T + b (row-parallel: y = x W^T, the caller sums it over the tensor group
  /// and calls add_bias; Bias::caller: y = x W^T).  x (B,in), y (B,out); rows may be strided
  /// (stride_0 >= extent 1).
  void forward(const ExecSpace& exec, const MatrixU<const T>& x, const MatrixU<T>& y,
               Bias who = Bias::layer) const {
    check_shape("forward: x", x, int(x.extent(0)), in_);
    forward_product(exec, int(x.extent(0)), x.data(), nullptr, ld(x), y, who);
  }

  /// \brief forward() of an input kept in bf16 (the same bits as forward() on its values as
  /// floats). Needs blas::bf16_operands(precision()).
  void forward_bf16(const ExecSpace& exec, const Bf16Matrix& x, const MatrixU<T>& y,
                    Bias who = Bias::layer) const {
    check_shape("forward: x", x, int(x.extent(0)), in_);
    forward_product(exec, int(x.extent(0)), nullptr, x.data(), ld(x), y, who);
  }

  /// \brief forward_bf16() with y stored in bf16 (blas::matmul with a bf16 C: the product, and
  /// with Bias::layer the bias added to its fp32 sums, rounded once as the product stores it), for
  /// a consumer that reads bf16. A row-parallel layer's output is a partial sum over the tensor
  /// group, summed in fp32: not for one (std::logic_error).
  void forward_bf16(const ExecSpace& exec, const Bf16Matrix& x, const MatrixU<std::uint16_t>& y,
                    Bias who = Bias::layer) const {
    check_shape("forward: x", x, int(x.extent(0)), in_);
    check_shape("forward: y", y, int(x.extent(0)), out_);
    if (split_ == Split::row)
      throw std::logic_error("tessera::nn::Linear::forward_bf16: a bf16 output of a row-parallel layer");
    product_bf16(exec, blas::Op::N, blas::Op::T, int(x.extent(0)), out_, in_, In{nullptr, x.data(), ld(x)},
                 In{nullptr, nullptr, 0}, who == Bias::layer && has_bias() ? store_->value(bias_).data() : nullptr, y.data(),
                 ld(y));
  }

  /// \brief y += b (row-parallel layers, after the sum over the tensor group).
  void add_bias(const ExecSpace& exec, const MatrixU<T>& y) const {
    if (has_bias()) kernels::bias_add(exec, store_->value(bias_), y);
  }

  /// Sums a buffer over the tensor group in place.
  using TensorSum = std::function<void(T*, std::size_t)>;

  /// \brief forward(), completed over the tensor group: a row-parallel layer's partial
  /// product is summed (`sum`) and its bias added (unless Bias::caller), so y is the whole
  /// output on every rank. Reads the weight and, for a row-parallel layer, the bias: call it
  /// between a unit's before_forward and after_forward hooks.
  void forward(const ExecSpace& exec, const MatrixU<const T>& x, const MatrixU<T>& y,
               const TensorSum& sum, Bias who = Bias::layer) const {
    forward(exec, x, y, who);
    complete_forward(exec, y, sum, who);
  }
  void forward_bf16(const ExecSpace& exec, const Bf16Matrix& x, const MatrixU<T>& y, const TensorSum& sum,
                    Bias who = Bias::layer) const {
    forward_bf16(exec, x, y, who);
    complete_forward(exec, y, sum, who);
  }

  /// \brief backward(), completed over the tensor group: a column-parallel layer's input
  /// gradient (a partial sum over the ranks' output blocks) is summed with `sum`.
  void backward(const ExecSpace& exec, const MatrixU<const T>& x, const MatrixU<const T>& dy,
                const MatrixU<T>& dx, const TensorSum& sum, Bias who = Bias::layer) const {
    backward(exec, x, dy, dx, who);
    complete_backward(exec, dx, sum);
  }
  void backward_bf16(const ExecSpace& exec, const Bf16Matrix& x, const MatrixU<const T>& dy,
                     const MatrixU<T>& dx, const TensorSum& sum, Bias who = Bias::layer) const {
    backward_bf16(exec, x, dy, dx, who);
    complete_backward(exec, dx, sum);
  }
  /// \brief backward_bf16() with dy kept in bf16 as well (written so by the kernel that made it,
  /// which also summed the bias gradient: the layer's bias is the caller's). Completed over the
  /// tensor group as above.
  void backward_bf16(const ExecSpace& exec, const Bf16Matrix& x, const Bf16Matrix& dy, const MatrixU<T>& dx,
                     const TensorSum& sum) const {
    check_shape("backward: x", x, int(x.extent(0)), in_);
    check_shape("backward: dy", dy, int(x.extent(0)), out_);
    backward_products(exec, int(x.extent(0)), {nullptr, x.data(), ld(x)}, {nullptr, dy.data(), ld(dy)}, dx);
    complete_backward(exec, dx, sum);
  }

  /// \brief backward() with dy given twice: in fp32 (the bias gradient sums it, as backward's)
  /// and rounded to bf16 (dy16, written by the kernel that made dy), which both products read:
  /// the bits backward() gets by converting dy at each product, without the conversions. x in
  /// fp32 or, in the second form, kept in bf16. Completed over the tensor group as above.
  void backward_bf16(const ExecSpace& exec, const MatrixU<const T>& x, const MatrixU<const T>& dy,
                     const Bf16Matrix& dy16, const MatrixU<T>& dx, const TensorSum& sum) const {
    check_shape("backward: x", x, int(x.extent(0)), in_);
    backward_twice(exec, int(x.extent(0)), In{x.data(), nullptr, ld(x)}, dy, dy16, dx, sum);
  }
  void backward_bf16(const ExecSpace& exec, const Bf16Matrix& x, const MatrixU<const T>& dy,
                     const Bf16Matrix& dy16, const MatrixU<T>& dx, const TensorSum& sum) const {
    check_shape("backward: x", x, int(x.extent(0)), in_);
    backward_twice(exec, int(x.extent(0)), In{nullptr, x.data(), ld(x)}, dy, dy16, dx, sum);
  }

  /// \brief backward_bf16() with dx stored in bf16 (blas::matmul with a bf16 C), for a consumer
  /// that reads bf16; dy in fp32 (the bias gradient as backward's) or bf16 (the caller's, as
  /// above). A column-parallel layer's dx is a partial sum over the tensor group, summed in fp32:
  /// not for one (std::logic_error).
  void backward_bf16(const ExecSpace& exec, const Bf16Matrix& x, const MatrixU<const T>& dy,
                     const MatrixU<std::uint16_t>& dx, Bias who = Bias::layer) const {
    check_shape("backward: x", x, int(x.extent(0)), in_);
    check_shape("backward: dy", dy, int(x.extent(0)), out_);
    if (who == Bias::layer && has_bias()) kernels::bias_backward(exec, dy, store_->grad(bias_));
    backward_products_bf16(exec, int(x.extent(0)), In{nullptr, x.data(), ld(x)}, In{dy.data(), nullptr, ld(dy)}, dx);
  }
  void backward_bf16(const ExecSpace& exec, const Bf16Matrix& x, const Bf16Matrix& dy,
                     const MatrixU<std::uint16_t>& dx) const {
    check_shape("backward: x", x, int(x.extent(0)), in_);
    check_shape("backward: dy", dy, int(x.extent(0)), out_);
    backward_products_bf16(exec, int(x.extent(0)), In{nullptr, x.data(), ld(x)}, In{nullptr, dy.data(), ld(dy)}, dx);
  }

  /// \brief dW += dy^T x, db += colsum(dy) (both accumulate, for micro-batches; db only with
  /// Bias::layer), and dx = dy W when dx is not empty (dx is overwritten).
  /// x (B,in), dy (B,out), dx (B,in).
  void backward(const ExecSpace& exec, const MatrixU<const T>& x, const MatrixU<const T>& dy,
                const MatrixU<T>& dx, Bias who = Bias::layer) const {
    check_shape("backward: x", x, int(x.extent(0)), in_);
    check_shape("backward: dy", dy, int(x.extent(0)), out_);
    if (who == Bias::layer && has_bias()) kernels::bias_backward(exec, dy, store_->grad(bias_));
    backward_products(exec, int(x.extent(0)), {x.data(), nullptr, ld(x)}, {dy.data(), nullptr, ld(dy)}, dx);
  }

  /// \brief backward() with the input kept in bf16 (as forward_bf16). Needs
  /// blas::bf16_operands(precision()).
  void backward_bf16(const ExecSpace& exec, const Bf16Matrix& x, const MatrixU<const T>& dy,
                     const MatrixU<T>& dx, Bias who = Bias::layer) const {
    check_shape("backward: x", x, int(x.extent(0)), in_);
    check_shape("backward: dy", dy, int(x.extent(0)), out_);
    if (who == Bias::layer && has_bias()) kernels::bias_backward(exec, dy, store_->grad(bias_));
    backward_products(exec, int(x.extent(0)), {nullptr, x.data(), ld(x)}, {dy.data(), nullptr, ld(dy)}, dx);
  }

  /// \brief For layers that read the same input (q, k and v; gate and up): dW += dy^T x, and dx
  /// = dy W (accumulate: dx += dy W), the bias's gradient left to the caller and no sum over the
  /// tensor group (the caller sums dx once, after the last layer). x and dy as values or bf16.
  void backward_shared(const ExecSpace& exec, const MatrixU<const T>& x, const MatrixU<const T>& dy,
                       const MatrixU<T>& dx, bool accumulate) const {
    shared_products(exec, In{x.data(), nullptr, ld(x)}, int(x.extent(0)), In{dy.data(), nullptr, ld(dy)},
                    int(dy.extent(0)), int(dy.extent(1)), dx, accumulate);
  }
  void backward_shared(const ExecSpace& exec, const Bf16Matrix& x, const Bf16Matrix& dy, const MatrixU<T>& dx,
                       bool accumulate) const {
    shared_products(exec, In{nullptr, x.data(), ld(x)}, int(x.extent(0)), In{nullptr, dy.data(), ld(dy)},
                    int(dy.extent(0)), int(dy.extent(1)), dx, accumulate);
  }

 private:
  void complete_forward(const ExecSpace& exec, const MatrixU<T>& y, const TensorSum& sum, Bias who) const {
    if (split_ != Split::row) return;
    exec.fence();
    sum(y.data(), y.size());
    if (who == Bias::layer) add_bias(exec, y);
  }

  void complete_backward(const ExecSpace& exec, const MatrixU<T>& dx, const TensorSum& sum) const {
    if (split_ != Split::column || dx.data() == nullptr) return;
    exec.fence();
    sum(dx.data(), dx.size());
  }

  /// An operand of the products: T values or (b16) bf16, at row stride ld.
  struct In {
    const T* t;
    const std::uint16_t* b16;
    int ld;
  };

  void shared_products(const ExecSpace& exec, const In& x, int rows, const In& dy, int dy_rows, int dy_cols,
                       const MatrixU<T>& dx, bool accumulate) const {
    if (dy_rows != rows || dy_cols != out_ || dx.data() == nullptr)
      throw std::invalid_argument("tessera::nn::Linear::backward_shared: expected dy (B,out) and dx (B,in)");
    backward_products(exec, rows, x, dy, dx, accumulate ? T(1) : T(0));
  }


  /// The product's B as blas::Operand: b, or the weight where b is {} (its bf16 copy or its values).
  blas::Operand operand_b(const ExecSpace& exec, const In& b) const {
    if (b.t != nullptr || b.b16 != nullptr) return blas::Operand{b.t, b.b16, b.ld};
    if (bf16_weights(*store_, precision_)) return blas::Operand{nullptr, store_->bf16_value(exec, weight_), in_};
    return blas::Operand{store_->value_matrix(weight_).data(), nullptr, in_};
  }

  /// C = op(A) op(B) + beta C in the layer's precision, B the weight where b is {} (its bf16
  /// copy or its values).
  void product(const ExecSpace& exec, blas::Op ta, blas::Op tb, int m, int n, int k, const In& a, const In& b,
               T beta, T* C, int ldc) const {
    const bool weight = b.t == nullptr && b.b16 == nullptr;
    if constexpr (std::is_same_v<T, float>) {
      if (a.b16 != nullptr || b.b16 != nullptr || (weight && bf16_weights(*store_, precision_))) {
        blas::matmul(exec, precision_, ta, tb, m, n, k, 1.0f, blas::Operand{a.t, a.b16, a.ld}, operand_b(exec, b),
                     beta, C, ldc);
        return;
      }
    }
    const T* bt = weight ? store_->value_matrix(weight_).data() : b.t;
    blas::matmul(exec, precision_, ta, tb, m, n, k, T(1), a.t, a.ld, bt, weight ? in_ : b.ld, beta, C, ldc);
  }

  /// y = x W^T (+ b), x as fp32 values or (x16) bf16.
  void forward_product(const ExecSpace& exec, int batch, const T* x, const std::uint16_t* x16, int ldx,
                       const MatrixU<T>& y, Bias who) const {
    check_shape("forward: y", y, batch, out_);
    // Bias into every row of y, then y += x W^T: the weight is op(B), x is op(A).
    const bool bias = split_ != Split::row && who == Bias::layer && has_bias();
    if (bias) kernels::bias_broadcast(exec, store_->value(bias_), y);
    product(exec, blas::Op::N, blas::Op::T, batch, out_, in_, In{x, x16, ldx}, In{nullptr, nullptr, 0},
            bias ? T(1) : T(0), y.data(), ld(y));
  }

  /// dW += dy^T x and dx = dy W (backward(); the bias gradient is the caller's), x and dy as
  /// values or bf16.
  void backward_products(const ExecSpace& exec, int batch, const In& x, const In& dy, const MatrixU<T>& dx,
                         T dx_beta = T(0)) const {
    const MatrixU<T> dw = store_->grad_matrix(weight_);
    product(exec, blas::Op::T, blas::Op::N, out_, in_, batch, dy, x, T(1), dw.data(), in_);
    if (dx.data() != nullptr) {
      check_shape("backward: dx", dx, batch, in_);
      product(exec, blas::Op::N, blas::Op::N, batch, in_, out_, dy, In{nullptr, nullptr, 0}, dx_beta, dx.data(),
              ld(dx));
    }
  }

  /// The two backward_bf16() forms with dy in fp32 and bf16.
  void backward_twice(const ExecSpace& exec, int batch, const In& x, const MatrixU<const T>& dy,
                      const Bf16Matrix& dy16, const MatrixU<T>& dx, const TensorSum& sum) const {
    check_shape("backward: dy", dy, batch, out_);
    check_shape("backward: dy16", dy16, batch, out_);
    if (has_bias()) kernels::bias_backward(exec, dy, store_->grad(bias_));
    backward_products(exec, batch, x, In{nullptr, dy16.data(), ld(dy16)}, dx);
    complete_backward(exec, dx, sum);
  }

  /// C (bf16) = op(A) op(B) + bias (nullptr: none), B as product()'s. Float layers only.
  void product_bf16(const ExecSpace& exec, blas::Op ta, blas::Op tb, int m, int n, int k, const In& a, const In& b,
                    const T* bias, std::uint16_t* C, int ldc) const {
    if constexpr (std::is_same_v<T, float>) {
      blas::matmul(exec, precision_, ta, tb, m, n, k, 1.0f, blas::Operand{a.t, a.b16, a.ld}, operand_b(exec, b), C,
                   ldc, bias);
    } else {
      throw std::logic_error("tessera::nn::Linear: bf16 outputs of a layer that is not float");
    }
  }

  /// dW += dy^T x and dx (bf16) = dy W, for a layer whose dx needs no sum.
  void backward_products_bf16(const ExecSpace& exec, int batch, const In& x, const In& dy,
                              const MatrixU<std::uint16_t>& dx) const {
    check_shape("backward: dx", dx, batch, in_);
    if (split_ == Split::column)
      throw std::logic_error("tessera::nn::Linear::backward_bf16: a bf16 input gradient of a column-parallel layer");
    const MatrixU<T> dw = store_->grad_matrix(weight_);
    product(exec, blas::Op::T, blas::Op::N, out_, in_, batch, dy, x, T(1), dw.data(), in_);
    product_bf16(exec, blas::Op::N, blas::Op::N, batch, in_, out_, dy, In{nullptr, nullptr, 0}, nullptr, dx.data(),
                 ld(dx));
  }

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
  Split split_;
  Precision precision_;
  int in_;
  int out_;
  std::size_t weight_ = 0;
  std::size_t bias_ = no_bias;
  std::size_t unit_ = 0;
};

}  // namespace tessera::nn
