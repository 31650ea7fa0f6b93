#pragma once
// Pipeline schedules: the order in which one stage runs the forwards and backwards of a step's
// micro-batches.
//   gpipe        every forward, then every backward: a stage holds all m micro-batches' activations.
//   1f1b         stage s of p runs min(p - s - 1, m) forwards to fill the pipe, then alternates one
//                forward and one backward, then drains: it holds at most p - s micro-batches.
//   interleaved  1f1b over v chunks per stage (parallel.virtual_stages; Megatron's interleaved
//                schedule): chunk c of stage s is the model's chunk c p + s. Micro-batches go in
//                groups of p (m a multiple of p): the forwards of a group through chunk 0, then
//                chunk 1, ...; the backwards the same way from the last chunk. Stage s warms up
//                with min(m v, 2 (p - s - 1) + (v - 1) p) forwards, then alternates, then drains.
// Without interleaving backwards run in micro-batch order, so "the last backward of the step" is
// the same micro-batch everywhere; with it, each chunk's backwards do. Idle time (the bubble) is
// what a stage spends waiting for its neighbours: ideally (p - 1) / (v m + p - 1) of the step.
#include <vector>

#include "core/config.hpp"

namespace tessera {

struct PipelineOp {
  enum class Kind { forward, backward } kind;
  int micro = 0;
  int chunk = 0;  ///< which of the stage's chunks (0 without interleaving)
  bool operator==(const PipelineOp&) const = default;
};

/// \brief The op sequence of `stage` (0-based) of `stages` for `micro_batches` micro-batches
/// over `chunks` chunks per stage. Throws std::invalid_argument for counts out of range, and for
/// chunks > 1 unless the schedule is 1f1b over two stages or more and the micro-batches are a
/// multiple of the stages.
std::vector<PipelineOp> pipeline_schedule(PipelineSchedule kind, int stages, int stage, int micro_batches,
                                          int chunks = 1);

/// \brief The most activation slots (a micro-batch through one chunk) a stage holds at once
/// under the schedule.
int peak_in_flight(const std::vector<PipelineOp>& ops);

/// \brief The live slots the pipeline executor keeps a stage to (a retired slot counts until its
/// gradient's send completes): the schedule's peak, plus one over `chunks` > 1. Interleaved,
/// a send may complete only once the receiver posts its receive (a rendezvous), which can come
/// after that receiver's own next forward: two stages each waiting for a slot would then wait
/// for each other (p = 2, v = 2, m = 4 does). One slot more is enough in every layout the
/// tests simulate.
int slot_bound(const std::vector<PipelineOp>& ops, int chunks);

}  // namespace tessera
