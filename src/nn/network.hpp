#pragma once
// What every model kind (MLP, CNN, GPT) offers the training runtime: this rank's part of the
// model (a pipeline stage, a tensor rank's blocks) with activation slots, one per micro-batch in
// flight. A pipeline schedule keeps several: acquire() a slot, fill input() (data on the first
// stage, the previous stage's output elsewhere), forward(); on the last stage loss() writes
// grad_output(); elsewhere fill grad_output() from the next stage; backward() accumulates the
// parameter gradients and writes grad_input() (not on the first stage); release().
//
// Every buffer is a row-major matrix with one row per sample: a model whose activations have
// more dimensions (a sequence of tokens, an image) flattens them into the row.
#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/views.hpp"
#include "nn/hooks.hpp"
#include "nn/loss.hpp"

namespace tessera::nn {

/// Sum of per-sample losses and of correct predictions over one micro-batch (a sample's loss
/// and accuracy being means over its positions where it has several, as a token sequence does).
struct LossSums {
  double loss = 0.0;
  double correct = 0.0;
  double rel_l2 = 0.0;  ///< fields: the sum over samples of ||prediction - target|| / ||target||
};

template <class T>
class Network {
 public:
  virtual ~Network() = default;

  /// \brief Rows of every slot's buffers (allocated when a slot is first used). Frees the slots;
  /// none may be live.
  void reserve(int max_batch) {
    if (max_batch <= max_batch_) return;
    if (live_ > 0) throw std::logic_error("tessera::nn::Network::reserve with live slots");
    max_batch_ = max_batch;
    slot_batch_.clear();
    slot_live_.clear();
    clear_slots();
  }
  int max_batch() const { return max_batch_; }

  virtual bool first_stage() const = 0;
  virtual bool last_stage() const = 0;
  /// Floats per sample of input() / grad_input() and of output() / grad_output() on this rank.
  virtual int input_width() const = 0;
  virtual int output_width() const = 0;
  /// Labels per sample the loss reads (1 for a class, T for a token sequence).
  virtual int label_width() const { return 1; }
  /// \brief Bytes of activations `slots` slots of `max_batch` rows and the shared scratch take,
  /// exactly as add_slot() allocates them (mem::view_bytes per buffer); slots = 0: the shared
  /// scratch alone. The memory estimate (`tessera check`, run.memory_limit_mb) asks this, so a
  /// buffer added to add_slot() is added here too (test_activation_memory compares the two).
  virtual double activation_bytes(int max_batch, int slots) const = 0;

  /// \brief Takes a free slot for a micro-batch of `batch` rows (<= max_batch()).
  int acquire(int batch) {
    if (batch > max_batch_)
      throw std::invalid_argument("tessera::nn::Network: batch of " + std::to_string(batch) +
                                  " rows exceeds reserve(" + std::to_string(max_batch_) + ")");
    std::size_t k = 0;
    while (k < slot_live_.size() && slot_live_[k]) ++k;
    if (k == slot_live_.size()) {
      slot_live_.push_back(false);
      slot_batch_.push_back(0);
      add_slot();
    }
    slot_live_[k] = true;
    slot_batch_[k] = batch;
    peak_ = std::max(peak_, ++live_);
    return static_cast<int>(k);
  }
  void release(int slot) {
    batch_of(slot);
    slot_live_[static_cast<std::size_t>(slot)] = false;
    --live_;
  }
  int live_slots() const { return live_; }
  int peak_slots() const { return peak_; }

  virtual MatrixU<T> input(int slot) const = 0;        ///< (B, input_width): fill before forward
  virtual MatrixU<T> output(int slot) const = 0;       ///< (B, output_width): after forward
  virtual MatrixU<T> grad_output(int slot) const = 0;  ///< (B, output_width): before backward
  virtual MatrixU<T> grad_input(int slot) const = 0;   ///< (B, input_width): after backward

  virtual void forward(const ExecSpace& exec, int slot) = 0;
  virtual void backward(const ExecSpace& exec, int slot) = 0;

  /// \brief Last stage: the loss of the slot's output against labels (B * label_width()) or
  /// targets (B, output_width), and d(scale * loss sum)/d(output) into grad_output(slot).
  /// This default: softmax cross-entropy over the output row when labels are given, else the
  /// mean squared error.
  virtual LossSums loss(const ExecSpace& exec, int slot, VectorU<const std::int32_t> labels,
                        MatrixU<const T> targets, T scale) {
    const MatrixU<const T> out = output(slot);
    const MatrixU<T> d = grad_output(slot);
    const LossResult r = labels.data() != nullptr ? cross_entropy(exec, out, labels, scale, d)
                                                  : mean_squared_error(exec, out, targets, scale, d);
    return {r.loss_sum, static_cast<double>(r.correct)};
  }

  /// \brief Tells `hooks` (may be null) about each unit as forward and backward reach it.
  void set_hooks(LayerHooks* hooks) { hooks_ = hooks; }

 protected:
  /// Allocates the buffers of one more slot (max_batch() rows); slots are numbered in order.
  virtual void add_slot() = 0;
  /// Frees every slot's buffers.
  virtual void clear_slots() = 0;
  /// Rows of a live slot's micro-batch; throws std::logic_error for a free slot.
  int batch_of(int slot) const {
    const auto k = static_cast<std::size_t>(slot);
    if (slot < 0 || k >= slot_live_.size() || !slot_live_[k])
      throw std::logic_error("tessera::nn::Network: slot " + std::to_string(slot) + " is not acquired");
    return slot_batch_[k];
  }
  /// The first `batch` rows of a slot buffer.
  static MatrixU<T> rows(const Matrix<T>& m, int batch) {
    return MatrixU<T>(m.data(), static_cast<std::size_t>(batch), m.extent(1));
  }

  LayerHooks* hooks_ = nullptr;

 private:
  int max_batch_ = 0;
  std::vector<int> slot_batch_;
  std::vector<bool> slot_live_;
  int live_ = 0, peak_ = 0;
};

}  // namespace tessera::nn
