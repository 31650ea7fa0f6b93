#pragma once
// The optimizer step over one model's ParamStore, once its gradients are exchanged: the sum of a
// tied parameter's two gradients, the global gradient norm (over the sharding, tensor and pipeline
// groups), fp16's unscaling, clipping, the update of the spans the Sharding names, ZeRO's allgather
// after it, and the bf16 copies of the weights the next step's products read. It owns the
// optimizer and its state; the checkpointer and the replica check read them from optimizer().
//
// Two ways to drive it, one per gradient exchange (gradient_exchange.hpp):
//   run()                        the whole step at once, after every bucket's exchange completed;
//   open(), apply_bucket(), close()
//                                comm.priority's deferred step: each bucket is updated as its
//                                exchange ends, and the norm of the step is known at close().
#include <cstddef>
#include <vector>

#include "comm/communicator.hpp"
#include "core/config.hpp"
#include "nn/param_store.hpp"
#include "optim/optimizer.hpp"
#include "train/sharding.hpp"

namespace tessera {

/// What one step's finish did.
struct StepReport {
  /// The gradient norm before clipping (of the unscaled gradients) of the newest step whose update
  /// is complete: this step's, or with comm.priority the previous step's (0 at the first).
  double grad_norm = 0.0;
  /// A non-finite norm skipped the update (fp16's overflow): parameters and state are unchanged.
  bool skipped = false;
  /// Seconds spent waiting for or doing communication, and updating.
  double comm_s = 0.0, update_s = 0.0;
};

class OptimizerStep {
 public:
  /// \brief The optimizer for the state `sharding` (bound to `store`) says this rank holds.
  OptimizerStep(const Config& cfg, const Communicator& comm, nn::ParamStore<float>& store, Sharding& sharding);

  Optimizer& optimizer() { return opt_; }
  const Optimizer& optimizer() const { return opt_; }

  /// \brief The whole step, after every bucket's exchange completed: the tied sum, the norm,
  /// then (unless skip_nonfinite and the norm is not finite) clipping and the update of every
  /// span, ZeRO's allgather and the weights' bf16 copies. grad_scale: the factor the loss
  /// gradient carried (fp16's loss scale), divided out before clipping and the update. Collective
  /// over the sharding, tensor and pipeline groups.
  StepReport run(const ExecSpace& exec, double lr, double grad_scale, bool skip_nonfinite);

  // comm.priority's deferred step (the state not sharded, no tied pipeline pair, no loss scale).
  /// \brief Opens a step at learning rate lr: apply_bucket() may follow, once per bucket.
  void open(double lr);
  /// \brief Updates bucket b from its exchanged gradient and adds its squares to the step's norm;
  /// once a bucket was non-finite, it and every later one leave the parameters as they are.
  void apply_bucket(const ExecSpace& exec, std::size_t b);
  /// \brief Closes the open step (if any): its norm, reduced over the tensor group (NaN where a
  /// bucket was non-finite). Returns the norm of the last closed step. Collective over the tensor
  /// group where a step was open.
  double close();

 private:
  /// Sums a tied parameter's gradient (the first stage's original, the last stage's copy).
  void sum_tied_gradients(const ExecSpace& exec);

  const Config& cfg_;
  const Communicator& comm_;
  nn::ParamStore<float>& store_;
  Sharding& sharding_;
  Optimizer opt_;
  /// Per parameter: counted in this rank's part of the global norm (every tensor rank holds a
  /// replicated block: tensor rank 0 counts it; a tied copy is counted by its original).
  std::vector<char> counted_;
  /// The same, per bucket: only that bucket's parameters (the deferred step).
  std::vector<std::vector<char>> bucket_counted_;
  Vector<float> tied_recv_;  // the other stage's gradient of a tied parameter
  // The deferred step.
  bool open_ = false, nonfinite_ = false;
  double lr_ = 0.0, squares_ = 0.0, last_norm_ = 0.0;
};

}  // namespace tessera
