#pragma once
// Learning-rate schedules: a pure function of the step, so a resumed run needs no scheduler state.
#include <cstdint>

#include "core/config.hpp"

namespace tessera {

/// \brief Learning rate for optimizer step `step` (0-based) of `total_steps`.
/// Warm-up (any kind): lr * (step + 1) / warmup_steps for step < warmup_steps. Then
/// constant: lr; cosine: min_lr + (lr - min_lr) * (1 + cos(pi * p)) / 2 with p the fraction of the
/// post-warm-up steps done (0 at the first, 1 at the last); step: lr * gamma^floor(step / step_size);
/// cosine_restarts (SGDR): cycles of restart_steps, restart_steps * restart_mult, ... steps after the
/// warm-up, each min_lr + (lr - min_lr) * (1 + cos(pi * t / T_i)) / 2 with t the steps into the
/// cycle and T_i its length (PyTorch's CosineAnnealingWarmRestarts, stepped once per step).
double learning_rate(const ScheduleConfig& s, double lr, std::int64_t step, std::int64_t total_steps);

}  // namespace tessera
