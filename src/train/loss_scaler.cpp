#include "train/loss_scaler.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace tessera {
namespace {

bool scale_in_range(double s) {
  return std::isfinite(s) && s >= LossScaler::min_scale && s <= LossScaler::max_scale;
}

}  // namespace

LossScaler::LossScaler(Precision precision, double initial_scale, std::int64_t window)
    : enabled_(precision == Precision::fp16),
      window_(enabled_ ? window : 1),
      state_{enabled_ ? initial_scale : 1.0, 0, 0} {
  if (!enabled_) return;
  if (!scale_in_range(initial_scale)) {
    throw std::invalid_argument(fmt::format(
        "train.loss_scale = {} is outside [{}, {}] (the range the dynamic loss scale moves in). "
        "---> HINT: the default 65536 suits most fp16 runs",
        initial_scale, min_scale, max_scale));
  }
  if (window < 1) {
    throw std::invalid_argument(
        fmt::format("train.loss_scale_window = {} must be at least 1", window));
  }
}

bool LossScaler::update(bool grads_finite) {
  if (!enabled_) return grads_finite;
  if (!grads_finite) {
    state_.scale = std::max(state_.scale / 2.0, min_scale);
    state_.good_steps = 0;
    ++state_.skipped;
    return false;
  }
  if (++state_.good_steps >= window_) {
    state_.scale = std::min(state_.scale * 2.0, max_scale);
    state_.good_steps = 0;
  }
  return true;
}

void LossScaler::set_state(const State& s) {
  if (!scale_in_range(s.scale) || s.good_steps < 0 || s.skipped < 0) {
    throw std::invalid_argument(fmt::format(
        "loss scaler state (scale {}, good_steps {}, skipped {}) is invalid: the scale must lie "
        "in [{}, {}] and the counters be >= 0",
        s.scale, s.good_steps, s.skipped, min_scale, max_scale));
  }
  state_ = s;
}

}  // namespace tessera
