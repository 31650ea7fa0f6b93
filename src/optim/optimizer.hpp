#pragma once
// Optimizers over the flat parameter buffer: one kernel per step for the whole model.
#include <cstdint>
#include <string>
#include <vector>

#include "core/config.hpp"
#include "kernels/optimizer.hpp"
#include "kernels/views.hpp"

namespace tessera {

class Optimizer {
 public:
  /// \param n elements of state per buffer: the flat parameter buffer, or a ZeRO shard of it.
  Optimizer(const OptimizerConfig& cfg, std::size_t n);

  /// \brief A step in pieces: begin_step() counts it (AdamW's bias correction uses the count),
  /// then update() for each piece; a piece's state is the state's elements from state_offset on.
  void begin_step() { ++steps_; }
  /// `extras`: a factor on the gradients and the bf16 copies written in the same pass
  /// (kernels::UpdateExtras).
  void update(const ExecSpace& exec, VectorU<float> params, VectorU<float> grads, double lr,
              std::size_t state_offset, const kernels::UpdateExtras& extras = {});

  std::int64_t steps() const { return steps_; }
  void set_steps(std::int64_t s) { steps_ = s; }
  /// "sgd" or "adamw", as stored in checkpoints.
  std::string kind_name() const;
  /// Names of the per-element state buffers: {"momentum"} for SGD with momentum,
  /// {"exp_avg", "exp_avg_sq"} for AdamW, none for plain SGD.
  const std::vector<std::string>& state_names() const { return names_; }
  Vector<float> state(std::size_t i) const { return states_[i]; }

 private:
  OptimizerConfig cfg_;
  std::int64_t steps_ = 0;
  std::vector<std::string> names_;
  std::vector<Vector<float>> states_;
};

}  // namespace tessera
