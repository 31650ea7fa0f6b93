#pragma once
// The bucketed gradient exchange (gradient_exchange.hpp): each bucket is exchanged whole from the
// backward hook that completes it: with comm.overlap on, by MPI's nonblocking collective, completed
// later (the bucket of the first layer, last to fill, blocking); with it off, or an allreduce of
// comm.allreduce = ring | parameter-server, by a blocking call there. Under hybrid sharding a
// bucket's sum inside the node is followed by its chunk's sum across nodes. comm.no_sync keeps the
// gradients of all but the last micro-batch local. finish_step waits for every bucket, then runs
// the whole optimizer step.
#include <cstddef>
#include <vector>

#include "train/gradient_exchange.hpp"

namespace tessera {

class BucketedExchange final : public GradientExchange {
 public:
  BucketedExchange(const Config& cfg, const Communicator& comm, nn::ParamStore<float>& store, Sharding& sharding,
                   OptimizerStep& step);

  void begin_step(const ExecSpace& exec) override;
  void begin_backward(const ExecSpace& exec, int k, int count) override;
  void end_backward(const ExecSpace& exec) override;
  StepReport finish_step(const ExecSpace& exec, double lr, double grad_scale, bool skip_nonfinite) override;
  /// Every update is complete when finish_step returns: nothing.
  std::optional<double> flush() override { return std::nullopt; }

  // nn::LayerHooks
  void before_forward(std::size_t unit) override;
  void after_forward(std::size_t unit) override;
  void before_backward(std::size_t unit) override;
  void after_backward(std::size_t unit) override;

 private:
  struct BucketState {
    PendingOp op;
    bool exchanging = false;      // an exchange was started and its completion not yet handled
    bool across_pending = false;  // hybrid sharding: the sum across nodes follows the one in the node
  };
  void bucket_ready(std::size_t b);
  void start_exchange(std::size_t b, bool blocking);
  /// Moves bucket b's exchange on as far as it can go (wait: to its end): from the sum in the
  /// sharding group to the one across nodes (hybrid sharding), then to exchanged().
  void advance(std::size_t b, bool wait);
  void complete(std::size_t b) { advance(b, true); }
  void poll();
  void wait_all();

  const Communicator& comm_;
  nn::ParamStore<float>& store_;
  Sharding& sharding_;
  OptimizerStep& step_;
  ExecSpace exec_;
  bool overlap_ = true, no_sync_ = true, sync_ = true, blocking_allreduce_ = false;
  std::vector<BucketState> buckets_;
  std::size_t last_started_ = static_cast<std::size_t>(-1);  // the newest exchange started
};

}  // namespace tessera
