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
  const auto n = params.extent(0);
  if (cfg_.kind == OptimizerKind::adamw) {
    adamw_update(exec, n, params.data(), grads.data(), states_[0].data(), states_[1].data(),
                 static_cast<float>(lr), static_cast<float>(cfg_.beta1),
                 static_cast<float>(cfg_.beta2), static_cast<float>(cfg_.eps),
                 static_cast<float>(cfg_.weight_decay), steps_);
  } else {
    sgd_update(exec, n, params.data(), grads.data(), states_.empty() ? nullptr : states_[0].data(),
               static_cast<float>(lr), static_cast<float>(cfg_.momentum), cfg_.nesterov,
               static_cast<float>(cfg_.weight_decay));
  }
}

}  // namespace tessera
