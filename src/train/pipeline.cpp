#include "train/pipeline.hpp"

#include <algorithm>
#include <stdexcept>

namespace tessera {

std::vector<PipelineOp> pipeline_schedule(PipelineSchedule kind, int stages, int stage, int micro_batches) {
  if (stages < 1 || stage < 0 || stage >= stages || micro_batches < 1)
    throw std::invalid_argument("pipeline_schedule: stage or counts out of range");
  using K = PipelineOp::Kind;
  std::vector<PipelineOp> ops;
  if (kind == PipelineSchedule::gpipe) {
    for (int m = 0; m < micro_batches; ++m) ops.push_back({K::forward, m});
    for (int m = 0; m < micro_batches; ++m) ops.push_back({K::backward, m});
    return ops;
  }
  const int warmup = std::min(stages - stage - 1, micro_batches);
  int f = 0, b = 0;
  for (; f < warmup; ++f) ops.push_back({K::forward, f});
  while (f < micro_batches) {
    ops.push_back({K::forward, f++});
    ops.push_back({K::backward, b++});
  }
  while (b < micro_batches) ops.push_back({K::backward, b++});
  return ops;
}

int peak_in_flight(const std::vector<PipelineOp>& ops) {
  int live = 0, peak = 0;
  for (const auto& op : ops) {
    live += op.kind == PipelineOp::Kind::forward ? 1 : -1;
    peak = std::max(peak, live);
  }
  return peak;
}

}  // namespace tessera
