#include "optim/optimizer.hpp"

#include <cmath>
#include <stdexcept>

#include "core/memory.hpp"
#include "kernels/optimizer.hpp"

namespace tessera {

Optimizer::Optimizer(const OptimizerConfig& cfg, std::size_t n) : cfg_(cfg) {
  if (cfg.kind == OptimizerKind::adamw)
    names_ = {"exp_avg", "exp_avg_sq"};
  else if (cfg.momentum > 0.0)
    names_ = {"momentum"};
  for (const auto& name : names_) states_.emplace_back(mem::label(mem::Category::optim, "tessera::Optimizer::" + name), n);
}

std::string Optimizer::kind_name() const {
  return cfg_.kind == OptimizerKind::adamw ? "adamw" : "sgd";
}

void Optimizer::update(const ExecSpace& exec, VectorU<float> params, VectorU<float> grads,
                       double lr, std::size_t state_offset, const kernels::UpdateExtras& extras) {
  const std::size_t n = params.size();
  if (!states_.empty() && state_offset + n > states_[0].size())
    throw std::logic_error("tessera::Optimizer::update: piece beyond the optimizer state");
  const auto state = [&](std::size_t i) { return VectorU<float>(states_[i].data() + state_offset, n); };
  if (cfg_.kind == OptimizerKind::adamw) {
    const kernels::AdamWHyper h{lr, cfg_.beta1, cfg_.beta2, cfg_.eps, cfg_.weight_decay};
    kernels::adamw_step(exec, params, grads, state(0), state(1), h, steps_, extras);
  } else {
    const kernels::SgdHyper h{lr, cfg_.momentum, cfg_.weight_decay, cfg_.nesterov};
    kernels::sgd_step(exec, params, grads, states_.empty() ? VectorU<float>() : state(0), h, extras);
  }
}

}  // namespace tessera
