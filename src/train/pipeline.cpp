#include "train/pipeline.hpp"

#include <algorithm>
#include <stdexcept>

namespace tessera {

namespace {

using K = PipelineOp::Kind;

// Megatron's interleaved order: virtual micro-batch k of the m * v a stage runs in each
// direction belongs to group k / (p v) of p micro-batches; within its group, chunk (k / p) % v
// (backwards: counted from the last chunk) of micro-batch (k / (p v)) p + k % p.
PipelineOp interleaved_op(K kind, int k, int stages, int chunks) {
  const int group = k / (stages * chunks), in_group = k % (stages * chunks);
  const int chunk = in_group / stages;
  return {kind, group * stages + in_group % stages, kind == K::forward ? chunk : chunks - 1 - chunk};
}

std::vector<PipelineOp> interleaved_schedule(int stages, int stage, int micro_batches, int chunks) {
  const int total = micro_batches * chunks;
  // Warm-up: enough forwards that every later backward finds its gradient on the way; the last
  // stage starts its first backward after the forwards of its first chunks' group.
  const int warmup = std::min(total, 2 * (stages - stage - 1) + (chunks - 1) * stages);
  std::vector<PipelineOp> ops;
  int f = 0, b = 0;
  for (; f < warmup; ++f) ops.push_back(interleaved_op(K::forward, f, stages, chunks));
  while (f < total) {
    ops.push_back(interleaved_op(K::forward, f++, stages, chunks));
    ops.push_back(interleaved_op(K::backward, b++, stages, chunks));
  }
  while (b < total) ops.push_back(interleaved_op(K::backward, b++, stages, chunks));
  return ops;
}

}  // namespace

std::vector<PipelineOp> pipeline_schedule(PipelineSchedule kind, int stages, int stage, int micro_batches,
                                          int chunks) {
  if (stages < 1 || stage < 0 || stage >= stages || micro_batches < 1 || chunks < 1)
    throw std::invalid_argument("pipeline_schedule: stage or counts out of range");
  if (chunks > 1) {
    if (kind != PipelineSchedule::one_f_one_b || stages < 2 || micro_batches % stages != 0)
      throw std::invalid_argument("pipeline_schedule: interleaving needs 1f1b, two stages or more and "
                                  "micro-batches in groups of the stages");
    return interleaved_schedule(stages, stage, micro_batches, chunks);
  }
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

int slot_bound(const std::vector<PipelineOp>& ops, int chunks) {
  return peak_in_flight(ops) + (chunks > 1 ? 1 : 0);
}

}  // namespace tessera
