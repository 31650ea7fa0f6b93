// LossScaler's state machine: disabled for fp32 and bf16; for fp16 halving on overflow down to
// 1, doubling after `window` consecutive finite steps up to 2^24, the counters, and the
// checkpointed state, against a step-by-step model of the rule.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>

#include "train/loss_scaler.hpp"

namespace {

using tessera::LossScaler;
using tessera::Precision;
using State = LossScaler::State;

TEST(LossScaler, DisabledForFp32AndBf16) {
  for (Precision p : {Precision::fp32, Precision::bf16}) {
    // Even arguments fp16 would refuse: they do not apply.
    LossScaler s(p, 0.5, 0);
    EXPECT_FALSE(s.enabled());
    EXPECT_EQ(s.scale(), 1.0f);
    for (int i = 0; i < 5; ++i) EXPECT_TRUE(s.update(true));
    EXPECT_FALSE(s.update(false));  // a non-finite step is never applied, nothing else changes
    EXPECT_EQ(s.scale(), 1.0f);
    EXPECT_EQ(s.state(), (State{1.0, 0, 0}));
    // A state from an fp16 run is kept (for a later fp16 resume) but scale() stays 1.
    s.set_state({1024.0, 3, 2});
    EXPECT_EQ(s.scale(), 1.0f);
    EXPECT_EQ(s.state(), (State{1024.0, 3, 2}));
  }
}

TEST(LossScaler, Fp16StartsAtTheInitialScale) {
  LossScaler s(Precision::fp16, 65536.0, 1000);
  EXPECT_TRUE(s.enabled());
  EXPECT_EQ(s.window(), 1000);
  EXPECT_EQ(s.scale(), 65536.0f);
  EXPECT_EQ(s.state(), (State{65536.0, 0, 0}));
}

TEST(LossScaler, OverflowHalvesResetsTheCountAndSkips) {
  LossScaler s(Precision::fp16, 1024.0, 4);
  EXPECT_TRUE(s.update(true));
  EXPECT_TRUE(s.update(true));
  EXPECT_EQ(s.state(), (State{1024.0, 2, 0}));
  EXPECT_FALSE(s.update(false));
  EXPECT_EQ(s.state(), (State{512.0, 0, 1}));
  EXPECT_FALSE(s.update(false));  // consecutive overflows keep halving
  EXPECT_EQ(s.state(), (State{256.0, 0, 2}));
  EXPECT_EQ(s.scale(), 256.0f);
}

TEST(LossScaler, WindowOfFiniteStepsDoubles) {
  LossScaler s(Precision::fp16, 1024.0, 3);
  EXPECT_TRUE(s.update(true));
  EXPECT_TRUE(s.update(true));
  EXPECT_EQ(s.scale(), 1024.0f);
  EXPECT_TRUE(s.update(true));  // the third finite step is applied, then the scale doubles
  EXPECT_EQ(s.state(), (State{2048.0, 0, 0}));
  // An overflow in the middle of a window restarts it.
  EXPECT_TRUE(s.update(true));
  EXPECT_TRUE(s.update(true));
  EXPECT_FALSE(s.update(false));
  EXPECT_EQ(s.state(), (State{1024.0, 0, 1}));
  EXPECT_TRUE(s.update(true));
  EXPECT_TRUE(s.update(true));
  EXPECT_EQ(s.scale(), 1024.0f);
  EXPECT_TRUE(s.update(true));
  EXPECT_EQ(s.state(), (State{2048.0, 0, 1}));
}

TEST(LossScaler, WindowOfOneDoublesEveryFiniteStep) {
  LossScaler s(Precision::fp16, 1.0, 1);
  for (int i = 1; i <= 30; ++i) {
    EXPECT_TRUE(s.update(true));
    EXPECT_EQ(double(s.scale()), std::min(std::ldexp(1.0, i), LossScaler::max_scale)) << i;
  }
}

TEST(LossScaler, FloorAtOneAndCapAtTwoToThe24) {
  LossScaler low(Precision::fp16, 2.0, 10);
  EXPECT_FALSE(low.update(false));
  EXPECT_EQ(low.scale(), 1.0f);
  EXPECT_FALSE(low.update(false));  // stays at 1, still skips and counts
  EXPECT_EQ(low.state(), (State{1.0, 0, 2}));

  LossScaler high(Precision::fp16, LossScaler::max_scale / 2, 2);
  for (int i = 0; i < 2; ++i) EXPECT_TRUE(high.update(true));
  EXPECT_EQ(high.scale(), 16777216.0f);
  for (int i = 0; i < 2; ++i) EXPECT_TRUE(high.update(true));
  EXPECT_EQ(high.state(), (State{LossScaler::max_scale, 0, 0}));  // capped, window restarted
  EXPECT_FALSE(high.update(false));
  EXPECT_EQ(high.scale(), 8388608.0f);
}

TEST(LossScaler, NonPowerOfTwoInitialScaleMovesByFactorsOfTwo) {
  LossScaler s(Precision::fp16, 1000.0, 1);
  EXPECT_TRUE(s.update(true));
  EXPECT_EQ(s.scale(), 2000.0f);
  EXPECT_FALSE(s.update(false));
  EXPECT_FALSE(s.update(false));
  EXPECT_EQ(s.scale(), 500.0f);
}

TEST(LossScaler, RandomSequencesFollowTheRule) {
  std::mt19937 gen(42);
  for (int trial = 0; trial < 20; ++trial) {
    const std::int64_t window = 1 + std::int64_t(gen() % 7);
    const double initial = std::ldexp(1.0, int(gen() % 25));
    LossScaler s(Precision::fp16, initial, window);
    double scale = initial;
    std::int64_t good = 0, skipped = 0;
    for (int step = 0; step < 2000; ++step) {
      const bool finite = gen() % 5 != 0;
      const bool applied = s.update(finite);
      if (finite) {
        if (++good == window) {
          scale = std::min(scale * 2, 16777216.0);
          good = 0;
        }
      } else {
        scale = std::max(scale / 2, 1.0);
        good = 0;
        ++skipped;
      }
      ASSERT_EQ(applied, finite);
      ASSERT_EQ(s.state(), (State{scale, good, skipped})) << "trial " << trial << " step " << step;
      ASSERT_EQ(double(s.scale()), scale);
    }
  }
}

TEST(LossScaler, StateRoundTripsAndResumesTheSameSequence) {
  LossScaler a(Precision::fp16, 4096.0, 3);
  for (bool f : {true, true, false, true, true}) a.update(f);
  const State saved = a.state();
  EXPECT_EQ(saved, (State{2048.0, 2, 1}));

  LossScaler b(Precision::fp16, 65536.0, 3);  // a fresh run resumed from the checkpoint
  b.set_state(saved);
  EXPECT_EQ(b.state(), saved);
  EXPECT_EQ(b.scale(), 2048.0f);
  for (bool f : {true, false, true, true, true, false, false, true}) {
    EXPECT_EQ(a.update(f), b.update(f));
    EXPECT_EQ(a.state(), b.state());
  }

  // A smaller window than the checkpoint's count: the next finite step doubles.
  LossScaler c(Precision::fp16, 65536.0, 2);
  c.set_state({256.0, 5, 0});
  EXPECT_TRUE(c.update(true));
  EXPECT_EQ(c.state(), (State{512.0, 0, 0}));
}

TEST(LossScaler, RefusesWhatCannotBeRight) {
  EXPECT_THROW(LossScaler(Precision::fp16, 0.5, 10), std::invalid_argument);
  EXPECT_THROW(LossScaler(Precision::fp16, 0.0, 10), std::invalid_argument);
  EXPECT_THROW(LossScaler(Precision::fp16, 3.5e7, 10), std::invalid_argument);
  EXPECT_THROW(LossScaler(Precision::fp16, std::numeric_limits<double>::infinity(), 10),
               std::invalid_argument);
  EXPECT_THROW(LossScaler(Precision::fp16, std::numeric_limits<double>::quiet_NaN(), 10),
               std::invalid_argument);
  EXPECT_THROW(LossScaler(Precision::fp16, 1024.0, 0), std::invalid_argument);
  try {
    LossScaler(Precision::fp16, 0.5, 10);
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("train.loss_scale"), std::string::npos) << e.what();
  }
  EXPECT_NO_THROW(LossScaler(Precision::fp16, 1.0, 1));
  EXPECT_NO_THROW(LossScaler(Precision::fp16, 16777216.0, 1));

  LossScaler s(Precision::fp16, 1024.0, 10);
  EXPECT_THROW(s.set_state({0.5, 0, 0}), std::invalid_argument);
  EXPECT_THROW(s.set_state({1024.0, -1, 0}), std::invalid_argument);
  EXPECT_THROW(s.set_state({1024.0, 0, -1}), std::invalid_argument);
  EXPECT_THROW(s.set_state({std::numeric_limits<double>::quiet_NaN(), 0, 0}),
               std::invalid_argument);
  EXPECT_EQ(s.state(), (State{1024.0, 0, 0}));  // a refused state changes nothing
}

}  // namespace
