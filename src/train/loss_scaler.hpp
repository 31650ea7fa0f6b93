#pragma once
// Dynamic loss scaling for fp16 training (train.precision = "fp16"). fp16's smallest subnormal
// is 2^-24 and its largest finite value 65504, so small gradients vanish unless the loss (and
// with it every gradient) is multiplied by a scale S before backward and divided by S again
// before the optimizer. S is kept as large as the gradients allow: halved whenever they
// overflow, doubled after a run of clean steps. bf16 has fp32's exponent range and fp32 needs
// none of this: for them the scaler is disabled and S is 1.
//
// One step with the scaler (every data rank alike):
//   loss * scaler.scale() -> backward -> gradient exchange -> grads *= 1 / scaler.scale()
//   finite = kernels::all_finite(grads), the same on every rank (combine it over the ranks
//            that hold gradient shards: ZeRO, tensor, pipeline)
//   if (scaler.update(finite)) optimizer step; else skip it (no parameter or optimizer change)
// scale() must be read before update(): update() changes it for the next step.
#include <cstdint>

#include "core/precision.hpp"

namespace tessera {

class LossScaler {
 public:
  static constexpr double min_scale = 1.0;         ///< halving stops here
  static constexpr double max_scale = 16777216.0;  ///< 2^24: doubling stops here

  /// What a checkpoint keeps (and restores with set_state).
  struct State {
    double scale;             ///< the current scale (1 while disabled)
    std::int64_t good_steps;  ///< finite steps since the last change of scale or overflow
    std::int64_t skipped;     ///< steps skipped for non-finite gradients, since the run began

    bool operator==(const State&) const = default;
  };

  /// \brief Enabled for fp16 only, starting at initial_scale (train.loss_scale) and doubling
  /// after `window` (train.loss_scale_window) consecutive finite steps. Disabled (fp32, bf16):
  /// the arguments are ignored. Throws std::invalid_argument, when enabled, unless
  /// 1 <= initial_scale <= 2^24 and window >= 1.
  LossScaler(Precision precision, double initial_scale, std::int64_t window);

  /// True for fp16: scale() may differ from 1 and update() may skip steps.
  bool enabled() const { return enabled_; }
  std::int64_t window() const { return window_; }

  /// \brief The factor to multiply the loss by (and divide the gradients by); 1 when disabled.
  /// A power of two times the initial scale, so multiplying by it is exact in binary floats.
  float scale() const { return enabled_ ? float(state_.scale) : 1.0f; }

  /// \brief Advances the state machine after a backward pass; returns whether to apply the step.
  /// Enabled: non-finite gradients halve the scale (not below 1), reset good_steps, count a
  /// skipped step and return false; finite ones count a good step, double the scale (not above
  /// 2^24) and reset good_steps when `window` good steps are reached, and return true.
  /// Disabled: returns grads_finite and changes nothing (a non-finite fp32 or bf16 step is the
  /// caller's error to report). Call it on every rank with the same grads_finite.
  bool update(bool grads_finite);

  State state() const { return state_; }
  /// \brief Restores a checkpointed state. Throws std::invalid_argument unless
  /// 1 <= scale <= 2^24 and both counters are >= 0. A good_steps >= window (the window was
  /// made smaller) doubles at the next finite step.
  void set_state(const State& s);

 private:
  bool enabled_;
  std::int64_t window_;
  State state_;
};

}  // namespace tessera
