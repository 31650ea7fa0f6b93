// Learning-rate schedules against their closed forms.
#include <gtest/gtest.h>

#include <cmath>
#include <numbers>

#include "optim/schedule.hpp"

namespace tessera {
namespace {

TEST(Schedule, ConstantWithWarmup) {
  ScheduleConfig s;
  s.warmup_steps = 4;
  EXPECT_DOUBLE_EQ(learning_rate(s, 0.1, 0, 100), 0.025);
  EXPECT_DOUBLE_EQ(learning_rate(s, 0.1, 3, 100), 0.1);
  EXPECT_DOUBLE_EQ(learning_rate(s, 0.1, 50, 100), 0.1);
}

TEST(Schedule, CosineStartsAtLrAndEndsAtMinLr) {
  ScheduleConfig s;
  s.kind = ScheduleKind::cosine;
  s.warmup_steps = 10;
  s.min_lr = 0.001;
  const std::int64_t total = 110;
  EXPECT_DOUBLE_EQ(learning_rate(s, 0.1, 9, total), 0.1);
  EXPECT_DOUBLE_EQ(learning_rate(s, 0.1, 10, total), 0.1);
  EXPECT_NEAR(learning_rate(s, 0.1, total - 1, total), 0.001, 1e-15);
  // Halfway through the decay: the mean of lr and min_lr.
  const double p = 0.5;
  const std::int64_t mid = 10 + static_cast<std::int64_t>(p * 99);
  const double expected = 0.001 + 0.099 * 0.5 * (1 + std::cos(std::numbers::pi * (mid - 10) / 99.0));
  EXPECT_NEAR(learning_rate(s, 0.1, mid, total), expected, 1e-15);
  for (std::int64_t k = 11; k < total; ++k)
    EXPECT_LE(learning_rate(s, 0.1, k, total), learning_rate(s, 0.1, k - 1, total));
}

TEST(Schedule, StepDecay) {
  ScheduleConfig s;
  s.kind = ScheduleKind::step;
  s.step_size = 30;
  s.gamma = 0.5;
  EXPECT_DOUBLE_EQ(learning_rate(s, 0.2, 29, 100), 0.2);
  EXPECT_DOUBLE_EQ(learning_rate(s, 0.2, 30, 100), 0.1);
  EXPECT_DOUBLE_EQ(learning_rate(s, 0.2, 95, 100), 0.025);
}

// PyTorch's CosineAnnealingWarmRestarts, written from its documented closed form: the cycle n
// holding epoch t is floor(log_mult(t / T_0 * (mult - 1) + 1)).
double sgdr(double lr, double min_lr, std::int64_t t, std::int64_t t0, std::int64_t mult) {
  double t_cur = 0, t_i = static_cast<double>(t0);
  if (mult == 1) {
    t_cur = static_cast<double>(t % t0);
  } else {
    const auto n = static_cast<int>(std::floor(std::log(static_cast<double>(t) / t0 * (mult - 1) + 1) / std::log(mult)));
    t_cur = static_cast<double>(t) - t0 * (std::pow(mult, n) - 1) / (mult - 1);
    t_i = t0 * std::pow(mult, n);
  }
  return min_lr + (lr - min_lr) * (1 + std::cos(std::numbers::pi * t_cur / t_i)) / 2;
}

TEST(Schedule, CosineRestartsMatchSgdr) {
  for (const std::int64_t mult : {1, 2, 3}) {
    ScheduleConfig s;
    s.kind = ScheduleKind::cosine_restarts;
    s.warmup_steps = 5;
    s.restart_steps = 10;
    s.restart_mult = mult;
    s.min_lr = 0.01;
    for (std::int64_t k = 0; k < 5; ++k) EXPECT_DOUBLE_EQ(learning_rate(s, 0.5, k, 1000), 0.5 * (k + 1) / 5.0);
    for (std::int64_t k = 5; k < 600; ++k)
      EXPECT_NEAR(learning_rate(s, 0.5, k, 1000), sgdr(0.5, 0.01, k - 5, 10, mult), 1e-12) << "mult " << mult << " step " << k;
    // Each cycle starts at lr: after 10, then 10 * mult, ... steps.
    std::int64_t start = 5, length = 10;
    for (int cycle = 0; cycle < 4; ++cycle, start += length, length *= mult) {
      EXPECT_DOUBLE_EQ(learning_rate(s, 0.5, start, 1000), 0.5) << "cycle " << cycle;
      EXPECT_LT(learning_rate(s, 0.5, start + length - 1, 1000), learning_rate(s, 0.5, start + length - 2, 1000));
    }
  }
  // Steps far beyond any cycle count stay cheap and in range.
  ScheduleConfig s;
  s.kind = ScheduleKind::cosine_restarts;
  s.restart_steps = 1;
  s.restart_mult = 2;
  const double far = learning_rate(s, 1.0, std::int64_t{1} << 47, std::int64_t{1} << 48);
  EXPECT_TRUE(far >= 0.0 && far <= 1.0);
}

}  // namespace
}  // namespace tessera
