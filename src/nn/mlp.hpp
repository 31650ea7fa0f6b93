#pragma once
// Multi-layer perceptron: Linear, activation, Linear, activation, ..., Linear (no activation on
// the output). Parameters are named layers.{i}.weight and layers.{i}.bias, i = 0, 1, 2, ...
//
// One object may hold only a pipeline stage, layers [first, end), and only this tensor rank's
// blocks of them: with tp > 1, layer i is column-parallel when i is even and not the last layer,
// row-parallel when i is odd (Megatron's MLP block: one sum over the tensor group in forward, one
// in backward), and whole (replicated) when it is the last layer at an even index.
//
// Activations live in slots, one per micro-batch in flight (a pipeline schedule keeps several):
// acquire() a slot, fill input(), forward(), and later fill grad_output(), backward(), read
// grad_input(), release(). The counters say how many slots were live at once.
//
// Every product computes in Part::precision (train.precision, decided by whoever builds the
// model). Where the products take bf16 operands (blas::bf16_operands(Part::precision): bf16 on a
// host bf16 GEMM), the activations between layers are kept in bf16: the activation kernel writes
// its output rounded to bf16 (the next layer's forward and its weight gradient read it), and in
// backward writes dL/dz both in fp32 (the bias gradient) and in bf16 (both products). The same
// bits as converting the fp32 values at each product, without the conversions. A stage's output
// (read by the next pipeline stage) stays fp32.
#include <cstdint>
#include <functional>
#include <vector>

#include "core/config.hpp"
#include "kernels/views.hpp"
#include "nn/hooks.hpp"
#include "nn/linear.hpp"
#include "nn/network.hpp"
#include "nn/param_store.hpp"

namespace tessera::nn {

template <class T>
class Mlp : public Network<T> {
 public:
  /// Which part of the model this object holds, and the tensor group.
  struct Part {
    int first_layer = 0;
    int end_layer = -1;  ///< -1: to the last layer
    int tp = 1;          ///< tensor ranks
    int t = 0;           ///< this tensor rank
    /// Sums a buffer over the tensor group in place (needed when tp > 1).
    std::function<void(T*, std::size_t)> tensor_sum;
    Precision precision = Precision::fp32;  ///< of every product (train.precision; float models)
  };

  /// The split of layer i of n under tp tensor ranks.
  static Split split_of(int i, int n, int tp);

  /// \brief Registers the part's parameters in `store` (before store.plan()). Widths are logical.
  Mlp(ParamStore<T>& store, int in, std::vector<int> hidden, int out, Activation act, Part part = {});

  int layers() const { return layers_total_; }
  int first_layer() const { return first_; }
  int end_layer() const { return end_; }
  bool first_stage() const override { return first_ == 0; }
  bool last_stage() const override { return end_ == layers_total_; }
  /// This rank's width of the part's input and output.
  int input_width() const override { return layers_.front().in_features(); }
  int output_width() const override { return layers_.back().out_features(); }
  /// \brief Bytes add_slot() allocates: `slots` slots of `max_batch` rows each plus the bf16
  /// gradient buffer the first slot makes for all (slots = 0: that buffer alone).
  double activation_bytes(int max_batch, int slots) const override;

  MatrixU<T> input(int slot) const override;        ///< (B, input_width): fill before forward
  MatrixU<T> output(int slot) const override;       ///< logits on the last stage
  MatrixU<T> grad_output(int slot) const override;
  MatrixU<T> grad_input(int slot) const override;   ///< not on the first stage

  /// \brief Forward of the slot's input through the part.
  void forward(const ExecSpace& exec, int slot) override;
  /// \brief Adds the gradient to the store's gradients (accumulates) from grad_output(slot);
  /// writes grad_input(slot) unless this is the first stage.
  void backward(const ExecSpace& exec, int slot) override;

  /// \brief One-slot convenience for a whole model: copies x into slot 0 and returns the logits.
  MatrixU<T> forward(const ExecSpace& exec, const MatrixU<const T>& x);
  /// \brief Backward of the last forward(x) from dlogits (B,out).
  void backward(const ExecSpace& exec, const MatrixU<const T>& dlogits);
  /// Rows of the last forward(x).
  int batch() const { return simple_batch_; }

  int in_features() const { return layers_.front().in_features(); }
  int out_features() const { return layers_.back().out_features(); }
  const std::vector<Linear<T>>& layer_list() const { return layers_; }

 protected:
  void add_slot() override;
  void clear_slots() override {
    slots_.clear();
    g16_ = {};
    simple_slot_ = -1;
  }

 private:
  struct Slot {
    Matrix<T> input, dinput;      // (max_batch, input_width)
    std::vector<Matrix<T>> z, a;  // per layer of the part: pre- and post-activation
    std::vector<Matrix<std::uint16_t>> a16;  // post-activation in bf16 (bf16 activations), else empty
    std::vector<Matrix<T>> g;     // per layer: dL/da, then dL/dz in place (dL/dlogits for the last)
  };
  bool hidden(int i) const { return i + 1 < layers_total_; }  // followed by an activation
  /// Whether layer i's activation output is kept in bf16 only: under bf16 activations, a hidden
  /// layer that is not the stage's last.
  bool kept_bf16(int i) const { return bf16_acts_ && hidden(i) && i + 1 < end_; }
  /// True where the slots hold bf16 activations; throws where the products no longer take them
  /// (the host's bf16 GEMM changed after the slots were made).
  bool bf16_acts() const;
  using Network<T>::rows;
  using Network<T>::hooks_;

  Activation act_;
  int layers_total_ = 0, first_ = 0, end_ = 0;
  Part part_;
  std::vector<Linear<T>> layers_;  // layers [first_, end_)
  std::vector<Slot> slots_;
  bool bf16_acts_ = false;
  Matrix<std::uint16_t> g16_;  // dL/dz of one layer in bf16, shared by the slots (bf16 activations)
  int simple_slot_ = -1, simple_batch_ = 0;
};

extern template class Mlp<float>;
extern template class Mlp<double>;

}  // namespace tessera::nn
