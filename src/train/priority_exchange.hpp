#pragma once
// comm.priority's gradient exchange (gradient_exchange.hpp; zero 0, no pipeline, no clipping, no
// fp16: the deck refuses the rest): each bucket's exchange goes in pieces (PieceScheduler: the
// buckets of the first layers first, a bound on the bytes in flight), and finish_step does not wait
// for them: a bucket is updated (OptimizerStep::apply_bucket) when its last piece is in, at the
// latest in the next step's before_forward of its units, so that step's forward of the first
// layers runs while the later layers' bytes still travel. finish_step's report therefore carries
// the previous step's gradient norm (0 at the first); flush() completes and applies everything. A
// bucket with a non-finite gradient is not applied, nor any after it.
#include <cstddef>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "train/gradient_exchange.hpp"
#include "train/piece_scheduler.hpp"

namespace tessera {

class PriorityExchange final : public GradientExchange {
 public:
  /// \brief Throws std::logic_error where the state is sharded (the deck refuses it first).
  PriorityExchange(const Config& cfg, const Communicator& comm, nn::ParamStore<float>& store, Sharding& sharding,
                   OptimizerStep& step);
  ~PriorityExchange() override;

  void begin_step(const ExecSpace& exec) override;
  void begin_backward(const ExecSpace& exec, int k, int count) override;
  void end_backward(const ExecSpace& exec) override;
  StepReport finish_step(const ExecSpace& exec, double lr, double grad_scale, bool skip_nonfinite) override;
  std::optional<double> flush() override;
  /// The pieces started since the last call (buckets in the order sent, run-length) and how the
  /// forwards ran (units run with pieces in flight, time waited for a bucket).
  std::string take_report() override;

  // nn::LayerHooks
  void before_forward(std::size_t unit) override;
  void after_forward(std::size_t unit) override;
  void before_backward(std::size_t unit) override;
  void after_backward(std::size_t unit) override;

 private:
  struct Flight {
    PendingOp op;
    std::size_t bucket = 0;
    bool seen = false;  // its completion counted in undone_
  };
  void poll();
  void start_pieces();
  void retire_oldest();
  void test_pieces();
  void apply_done();
  /// Retires pieces oldest first until bucket b has none left (or every bucket: npos), applies.
  void wait_bucket(std::size_t b);

  const Communicator& comm_;
  nn::ParamStore<float>& store_;
  Sharding& sharding_;
  OptimizerStep& step_;
  ExecSpace exec_;
  bool no_sync_ = true, sync_ = true;
  std::unique_ptr<PieceScheduler> sched_;
  std::deque<Flight> flight_;        // the pieces in flight, oldest first (sched_'s order)
  std::vector<std::size_t> undone_;  // per bucket: pieces not yet seen complete
  std::vector<char> pending_;        // per bucket: exchanged this step, not yet applied
  bool updates_open_ = false;        // finish_step opened the step's update
  std::vector<std::size_t> trace_;   // buckets of the pieces started since the last report
  std::size_t forward_units_ = 0, forward_overlapped_ = 0;
  double forward_wait_s_ = 0.0;
};

}  // namespace tessera
