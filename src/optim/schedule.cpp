#include "optim/schedule.hpp"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace tessera {

double learning_rate(const ScheduleConfig& s, double lr, std::int64_t step,
                     std::int64_t total_steps) {
  if (step < s.warmup_steps)
    return lr * static_cast<double>(step + 1) / static_cast<double>(s.warmup_steps);
  switch (s.kind) {
    case ScheduleKind::constant: return lr;
    case ScheduleKind::step:
      return lr * std::pow(s.gamma, static_cast<double>(step / s.step_size));
    case ScheduleKind::cosine: {
      const std::int64_t span = std::max<std::int64_t>(1, total_steps - s.warmup_steps - 1);
      const double p = std::clamp(static_cast<double>(step - s.warmup_steps) / static_cast<double>(span), 0.0, 1.0);
      return s.min_lr + (lr - s.min_lr) * 0.5 * (1.0 + std::cos(std::numbers::pi * p));
    }
    case ScheduleKind::cosine_restarts: {
      // SGDR (Loshchilov & Hutter): cycles of T_0, T_0 * mult, T_0 * mult^2, ... steps, each a
      // cosine from lr down towards min_lr, then a restart at lr. t: steps into the cycles.
      std::int64_t t = step - s.warmup_steps, length = s.restart_steps;
      if (s.restart_mult == 1) {
        t %= length;
      } else {
        while (t >= length) {  // cycles grow geometrically: at most ~48 turns
          t -= length;
          length *= s.restart_mult;
        }
      }
      const double p = static_cast<double>(t) / static_cast<double>(length);
      return s.min_lr + (lr - s.min_lr) * 0.5 * (1.0 + std::cos(std::numbers::pi * p));
    }
  }
  return lr;
}

}  // namespace tessera
