#pragma once
// The data-parallel gradient exchange over one model's ParamStore: the layer hooks that gather a
// ZeRO-3 bucket's values before its forward and backward and start a bucket's exchange when its
// backward completes, and the end of a step, which hands the exchanged gradients to the optimizer
// step (optimizer_step.hpp). Where each piece of the state lives (ZeRO stages 1-3 over the replica
// group) is the Sharding's business (train/sharding.hpp): an exchange asks it where a bucket's
// gradients are and where their exchange delivers them, and never looks at the stage itself.
// The replica group holds every rank with the same parameters: the data group, times the spatial
// group where samples are split over ranks (parallel.spatial: each holds a block of every
// sample's grid, so its gradients are partial sums that this exchange completes).
//
// Two implementations, one per deck setting (make() picks):
//   BucketedExchange (bucketed_exchange.hpp)  each bucket exchanged whole, overlapped with the
//       backward; finish_step waits for every bucket and runs the whole optimizer step.
//   PriorityExchange (priority_exchange.hpp)  comm.priority: buckets in pieces, the first layers'
//       first; finish_step does not wait, and each bucket is updated when its exchange ends, at
//       the latest before the next step's forward reads it.
#include <cstddef>
#include <memory>
#include <optional>
#include <string>

#include "comm/communicator.hpp"
#include "core/config.hpp"
#include "nn/hooks.hpp"
#include "nn/param_store.hpp"
#include "train/optimizer_step.hpp"
#include "train/sharding.hpp"

namespace tessera {

class GradientExchange : public nn::LayerHooks {
 public:
  /// \brief The exchange the deck asks for, over `store` (planned and allocated from
  /// sharding.layout() and bound to `sharding`), finishing its steps through `step`.
  static std::unique_ptr<GradientExchange> make(const Config& cfg, const Communicator& comm,
                                                nn::ParamStore<float>& store, Sharding& sharding,
                                                OptimizerStep& step);
  ~GradientExchange() override = default;

  /// \brief The step: begin_step; forwards and backwards (through the hooks) in any order the
  /// pipeline schedule gives, each backward between begin_backward (k = backwards done so far
  /// this step, of count) and end_backward; then finish_step.
  virtual void begin_step(const ExecSpace& exec) = 0;
  virtual void begin_backward(const ExecSpace& exec, int k, int count) = 0;
  virtual void end_backward(const ExecSpace& exec) = 0;
  /// \brief Ends the step's exchange and starts or runs its update at learning rate lr (see
  /// OptimizerStep::run for grad_scale and skip_nonfinite). The report's norm is that of the
  /// newest step whose update is complete. Collective over the replica, tensor and pipeline
  /// groups; every rank calls it at the same points.
  virtual StepReport finish_step(const ExecSpace& exec, double lr, double grad_scale, bool skip_nonfinite) = 0;
  /// \brief Completes every update still in flight, before anything reads the parameters between
  /// steps (a checkpoint, an evaluation, a replica check, the end). Returns the gradient norm of
  /// the step it completed (NaN where a bucket was non-finite), or nothing where every update was
  /// already complete. Collective like finish_step.
  virtual std::optional<double> flush() = 0;
  /// \brief One line on how the exchange ran since the last call, for the log; empty where the
  /// exchange has nothing to say.
  virtual std::string take_report() { return {}; }

  /// Seconds spent inside the hooks (gathers, starting, testing and completing exchanges) since
  /// the last call.
  double take_hook_comm_seconds() {
    const double s = hook_comm_s_;
    hook_comm_s_ = 0.0;
    return s;
  }

 protected:
  /// Adds the lifetime of a hook to hook_comm_s_: what hooks do is communication.
  class HookTimer {
   public:
    explicit HookTimer(GradientExchange& owner);
    ~HookTimer();
    HookTimer(const HookTimer&) = delete;
    HookTimer& operator=(const HookTimer&) = delete;

   private:
    double& total_;
    double start_;
  };
  /// Evaluation's forwards between steps belong to no step.
  void forget_hook_comm_seconds() { hook_comm_s_ = 0.0; }

 private:
  double hook_comm_s_ = 0.0;
};

}  // namespace tessera
