#pragma once
// Pipeline schedules: the order in which one stage runs the forwards and backwards of a step's
// micro-batches.
//   gpipe  every forward, then every backward: a stage holds all m micro-batches' activations.
//   1f1b   stage s of p runs min(p - s - 1, m) forwards to fill the pipe, then alternates one
//          forward and one backward, then drains: it holds at most p - s micro-batches.
// Backwards run in micro-batch order in both, so "the last backward of the step" is the same
// micro-batch everywhere. Idle time (the bubble) is what a stage spends waiting for its
// neighbours: ideally (p - 1) / (m + p - 1) of the step.
#include <vector>

#include "core/config.hpp"

namespace tessera {

struct PipelineOp {
  enum class Kind { forward, backward } kind;
  int micro = 0;
  bool operator==(const PipelineOp&) const = default;
};

/// \brief The op sequence of `stage` (0-based) of `stages` for `micro_batches` micro-batches.
std::vector<PipelineOp> pipeline_schedule(PipelineSchedule kind, int stages, int stage, int micro_batches);

/// \brief The most micro-batches whose activations a stage holds at once under the schedule.
int peak_in_flight(const std::vector<PipelineOp>& ops);

}  // namespace tessera
