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

}  // namespace
}  // namespace tessera
