#pragma once
// The pipeline executor: runs micro-batches through this rank's pipeline stage, one chunk of the
// model or, under parallel.virtual_stages = v, v interleaved chunks (chunk c of stage s is the
// model's chunk c * pp + s). Training runs every forward and backward of a step in the schedule's
// order (train/pipeline.hpp); evaluation runs forwards only, one micro-batch after another.
// Activations go down the pipeline (from chunk c of the last stage to chunk c + 1 of the first)
// and their gradients back up with nonblocking sends and blocking receives on the pipeline
// communicator: the wait in a receive is the bubble, timed as Phase::pipeline. A micro-batch's
// activation slot of a chunk retires when its backward is done and is released once its sends
// have completed; a new forward waits for a retiring slot only where it would exceed the
// schedule's bound on live slots (slot_bound: peak_in_flight, plus one when interleaved).
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "comm/communicator.hpp"
#include "core/config.hpp"
#include "kernels/views.hpp"
#include "train/gradient_exchange.hpp"
#include "train/model.hpp"
#include "train/pipeline.hpp"
#include "train/step_timer.hpp"

namespace tessera {

/// One micro-batch's data as a stage needs it: inputs (B, features) on the first stage, labels
/// (B * label width) or targets (B, outputs) on the last; empty views elsewhere.
struct MicroBatch {
  MatrixU<const float> x;
  VectorU<const std::int32_t> labels;
  MatrixU<const float> targets;
};

/// What the executor asks of its caller about the micro-batches it runs.
struct MicroBatches {
  int count = 0;
  /// This data rank's samples of micro-batch m (every stage: the row count travels with them).
  std::function<std::span<const std::int64_t>(int m)> samples;
  /// Reads samples into device buffers; called only for the forwards of the model's first chunk
  /// (the first stage) and last chunk (the last stage), collective over the data group (its
  /// ranks are all the same stage and run the same ops, so the calls stay matched).
  std::function<MicroBatch(std::span<const std::int64_t> samples)> read;
  /// The model's last chunk: the loss of the micro-batch of `rows` > 0 samples in `slot`, which
  /// writes the gradient of its output for backward.
  std::function<void(int slot, int rows, const MicroBatch& data)> loss;
};

class PipelineExecutor {
 public:
  /// \brief An executor for `model` on this rank's pipeline stage. `timer` receives the data,
  /// forward, backward, allreduce, tensor and pipeline phases; `tensor_seconds` (may be null)
  /// is where the model's tensor sums add their time, moved from forward and backward into
  /// Phase::tensor.
  PipelineExecutor(const Config& cfg, const Communicator& comm, Model& model, StepTimer& timer,
                   double* tensor_seconds = nullptr);

  /// \brief The micro-batches' forwards and backwards in the schedule's order. Each backward
  /// runs between exchange.begin_backward and exchange.end_backward; the hooks start the gradient exchange.
  /// Returns with every slot released and every send complete. Collective over the pipeline
  /// group (and what the hooks and reads involve); call between exchange.begin_step and
  /// exchange.finish_step.
  void train(const ExecSpace& exec, GradientExchange& exchange, const MicroBatches& batches);

  /// \brief Forwards only, one micro-batch after another, each slot released after its forward
  /// (evaluation). Collective over the pipeline group.
  void forward_only(const ExecSpace& exec, const MicroBatches& batches);

 private:
  struct InFlight {
    int slot = -1, rows = 0;
    PendingOp send;  // the forward's activation to the next stage
  };
  // Activation slots whose micro-batch is done but whose sends may still be in flight.
  struct Retiring {
    int chunk = 0, slot = -1;
    std::vector<PendingOp> sends;
  };

  /// Reads micro-batch samples where chunk c needs them (the model's first or last chunk).
  MicroBatch read(const ExecSpace& exec, const MicroBatches& batches, int chunk, std::span<const std::int64_t> samples);
  /// Reads the op's micro-batch, keeps within `bound` live slots, receives its input, runs the
  /// chunk's forward (and the loss on the model's last chunk) and starts sending its output;
  /// eval: with evaluation's tags.
  void forward(const ExecSpace& exec, const MicroBatches& batches, const PipelineOp& op, int bound, InFlight& f,
               bool eval = false);
  /// Receives the op's output gradient, runs the chunk's backward (its k-th of count this step),
  /// starts sending its input gradient and retires its slot.
  void backward(const ExecSpace& exec, GradientExchange& exchange, const PipelineOp& op, int k, int count, InFlight& f);
  /// The message tag of the op's activation (or gradient): into_chunk, the one that enters the
  /// op's chunk from the stage before, else the one that leaves it for the stage after.
  int tag(const PipelineOp& op, bool into_chunk, bool gradient) const;
  int previous_stage() const { return (stage_ + stages_ - 1) % stages_; }
  int next_stage() const { return (stage_ + 1) % stages_; }
  /// Waits for retiring slots' sends until a new slot keeps within `bound` live slots.
  void make_room(const ExecSpace& exec, int bound);
  /// Releases the retiring slots whose sends are done (with wait: all of them, once done).
  void retire_slots(bool wait);
  /// Counts the hooks' and the tensor sums' seconds inside phase `from` as their own phases.
  void move_comm(Phase from, GradientExchange& exchange);

  const Config& cfg_;
  const Communicator& comm_;
  Model& model_;
  StepTimer& timer_;
  double* tensor_seconds_;
  int stage_ = 0, stages_ = 1;
  std::vector<Retiring> retiring_;
};

}  // namespace tessera
