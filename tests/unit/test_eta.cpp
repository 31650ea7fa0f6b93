// The ETA of a progress line (eta_seconds) for steps of 30 s, logged every step and every 10 steps:
// the first lines, a resumed run, and an evaluation or a checkpoint between two lines.
#include <gtest/gtest.h>

#include "train/run_output.hpp"

namespace tessera {
namespace {

constexpr double step_s = 30.0;

TEST(Eta, StepsOfThirtySecondsLoggedEveryStep) {
  // Line of step 10 of 100, nothing but steps so far.
  const Progress p{.step = 10, .total_steps = 100, .last_logged_step = 9, .loop_start_step = 0,
                   .interval_step_s = step_s, .loop_s = 10 * step_s, .loop_step_s = 10 * step_s};
  EXPECT_DOUBLE_EQ(eta_seconds(p), 90 * step_s);
  EXPECT_EQ(format_duration(eta_seconds(p)), "45m00s");
}

TEST(Eta, StepsOfThirtySecondsLoggedEveryTenSteps) {
  const Progress p{.step = 20, .total_steps = 100, .last_logged_step = 10, .loop_start_step = 0,
                   .interval_step_s = 10 * step_s, .loop_s = 20 * step_s, .loop_step_s = 20 * step_s};
  EXPECT_DOUBLE_EQ(eta_seconds(p), 80 * step_s);
  // The last line: nothing left.
  const Progress last{.step = 100, .total_steps = 100, .last_logged_step = 90, .loop_start_step = 0,
                      .interval_step_s = 10 * step_s, .loop_s = 100 * step_s, .loop_step_s = 100 * step_s};
  EXPECT_EQ(eta_seconds(last), 0.0);
  EXPECT_EQ(format_duration(eta_seconds(last)), "0s");
}

TEST(Eta, ASlowFirstStepLeavesTheEstimateAtTheNextLine) {
  // Step 1 took 90 s (start-up), the others 30 s.
  const Progress first{.step = 1, .total_steps = 1001, .last_logged_step = 0, .loop_start_step = 0,
                       .interval_step_s = 90, .loop_s = 90, .loop_step_s = 90};
  EXPECT_DOUBLE_EQ(eta_seconds(first), 1000 * 90.0);  // all that is known yet
  const Progress second{.step = 2, .total_steps = 1001, .last_logged_step = 1, .loop_start_step = 0,
                        .interval_step_s = step_s, .loop_s = 120, .loop_step_s = 120};
  EXPECT_DOUBLE_EQ(eta_seconds(second), 999 * step_s);
  EXPECT_EQ(format_duration(eta_seconds(second)), "8h19m");
  // Every 10 steps: the first line carries the start-up (330 s / 10), the second does not.
  const Progress tenth{.step = 10, .total_steps = 1000, .last_logged_step = 0, .loop_start_step = 0,
                       .interval_step_s = 330, .loop_s = 330, .loop_step_s = 330};
  EXPECT_DOUBLE_EQ(eta_seconds(tenth), 990 * 33.0);
  const Progress twentieth{.step = 20, .total_steps = 1000, .last_logged_step = 10, .loop_start_step = 0,
                           .interval_step_s = 10 * step_s, .loop_s = 630, .loop_step_s = 630};
  EXPECT_DOUBLE_EQ(eta_seconds(twentieth), 980 * step_s);
}

TEST(Eta, AResumedRunCountsItsStepsFromTheResume) {
  // Resumed at step 100 of 1000; a 60-s checkpoint after step 105; the line of step 110.
  const Progress p{.step = 110, .total_steps = 1000, .last_logged_step = 100, .loop_start_step = 100,
                   .interval_step_s = 10 * step_s, .loop_s = 10 * step_s + 60, .loop_step_s = 10 * step_s};
  // The 60 s between steps, spread over the 10 steps since the resume: 6 s a step.
  EXPECT_DOUBLE_EQ(eta_seconds(p), 890 * (step_s + 6.0));
  EXPECT_EQ(format_duration(eta_seconds(p)), "8h54m");
}

TEST(Eta, AnEvaluationBetweenLinesIsSpreadOverTheStepsDone) {
  // Logged every step: a 120-s evaluation after step 10, then the line of step 11. The step
  // time stays 30 s; the evaluation adds 120 s / 11 steps, not 120 s to each step left.
  const Progress every_step{.step = 11, .total_steps = 100, .last_logged_step = 10, .loop_start_step = 0,
                            .interval_step_s = step_s, .loop_s = 11 * step_s + 120, .loop_step_s = 11 * step_s};
  EXPECT_DOUBLE_EQ(eta_seconds(every_step), 89 * (step_s + 120.0 / 11));
  // Logged every 10 steps: the evaluation after step 10 falls inside the interval of step 20.
  const Progress every_ten{.step = 20, .total_steps = 100, .last_logged_step = 10, .loop_start_step = 0,
                           .interval_step_s = 10 * step_s, .loop_s = 20 * step_s + 120, .loop_step_s = 20 * step_s};
  EXPECT_DOUBLE_EQ(eta_seconds(every_ten), 80 * (step_s + 6.0));
  EXPECT_EQ(format_duration(eta_seconds(every_ten)), "48m00s");
}

}  // namespace
}  // namespace tessera
