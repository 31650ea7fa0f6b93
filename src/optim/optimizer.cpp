#include "optim/optimizer.hpp"

#include <cmath>

#include "kernels/optimizer.hpp"

namespace tessera {

Optimizer::Optimizer(const OptimizerConfig& cfg, std::size_t n) : cfg_(cfg) {
  if (cfg.kind == OptimizerKind::adamw)
    names_ = {"exp_avg", "exp_avg_sq"};
  else if (cfg.momentum > 0.0)
    names_ = {"momentum"};
  for (const auto& name : names_) states_.emplace_back("Optimizer::" + name, n);
}

std::string Optimizer::kind_name() const {
  return cfg_.kind == OptimizerKind::adamw ? "adamw" : "sgd";
}

std::size_t Optimizer::state_bytes() const {
  std::size_t bytes = 0;
  for (const auto& s : states_) bytes += s.size() * sizeof(float);
  return bytes;
}

void Optimizer::step(const ExecSpace& exec, Vector<float> params, Vector<float> grads, double lr) {
  ++steps_;
  if (cfg_.kind == OptimizerKind::adamw) {
    const kernels::AdamWHyper h{lr, cfg_.beta1, cfg_.beta2, cfg_.eps, cfg_.weight_decay};
    kernels::adamw_step(exec, params, grads, states_[0], states_[1], h, steps_);
  } else {
    const kernels::SgdHyper h{lr, cfg_.momentum, cfg_.weight_decay, cfg_.nesterov};
    kernels::sgd_step(exec, params, grads, states_.empty() ? Vector<float>() : states_[0], h);
  }
}

}  // namespace tessera
