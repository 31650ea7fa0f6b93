#pragma once
// The data-parallel step over one model's ParamStore: bucketed gradient exchange overlapped with
// backward, no-sync accumulation, clipping and the optimizer. Where each piece of the state lives
// (ZeRO stages 1-3 over the replica group) is the Sharding's business (train/sharding.hpp): this
// class asks it where a bucket's gradients are and where their exchange delivers them, which spans
// to update and what to gather, and never looks at the stage itself.
// The replica group holds every rank with the same parameters: the data group, times the spatial
// group where samples are split over ranks (parallel.spatial: each holds a block of every
// sample's grid, so its gradients are partial sums that this exchange completes).
//
// Each bucket is exchanged from the backward hook that completes it: with comm.overlap on, by
// MPI's nonblocking collective, completed later (the bucket of the first layer, last to fill,
// blocking); with it off, or an allreduce of comm.allreduce = ring | parameter-server, by a
// blocking call there.
//
// comm.priority (zero 0): each bucket's exchange goes in pieces (PieceScheduler: the buckets of
// the first layers first, a bound on the bytes in flight), and finish_step does not wait for
// them: a bucket is updated when its last piece is in, at the latest in the next step's
// before_forward of its units, so that step's forward of the first layers runs while the later
// layers' bytes still travel. finish_step then returns the previous step's gradient norm (0 at
// the first); flush() completes and applies everything (before a checkpoint, an evaluation, a
// replica check, the end). A bucket with a non-finite gradient is not applied, nor any after it.
#include <cstddef>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.hpp"
#include "core/config.hpp"
#include "nn/hooks.hpp"
#include "nn/param_store.hpp"
#include "optim/optimizer.hpp"
#include "train/piece_scheduler.hpp"
#include "train/sharding.hpp"

namespace tessera {

class DataParallel final : public nn::LayerHooks {
 public:
  /// \brief Takes over `store`, planned and allocated from sharding.layout() and bound to
  /// `sharding`. Collective over the replica group only through later calls.
  DataParallel(const Config& cfg, const Communicator& comm, nn::ParamStore<float>& store, Sharding& sharding);
  ~DataParallel() override;

  /// \brief The step: begin_step; forwards and backwards (through the hooks) in any order the
  /// pipeline schedule gives, each backward between begin_backward (k = backwards done so far
  /// this step, of count) and end_backward; then finish_step, which completes the exchange,
  /// clips, updates and returns the global gradient norm (before clipping).
  void begin_step(const ExecSpace& exec);
  void begin_backward(const ExecSpace& exec, int k, int count);
  void end_backward(const ExecSpace& exec);
  /// grad_scale: the factor the loss gradient carried (fp16's loss scale; the gradients are
  /// divided by it before clipping and the update, and the returned norm is of the unscaled
  /// gradients). skip_nonfinite: a non-finite norm skips the update instead (the parameters
  /// and optimizer state stay as they were; skipped() says so).
  double finish_step(const ExecSpace& exec, double lr, double grad_scale = 1.0, bool skip_nonfinite = false);
  bool skipped() const { return skipped_; }
  /// \brief comm.priority: waits for every piece, applies every pending update and returns the
  /// gradient norm of the last finished step (NaN where a bucket was non-finite); otherwise just
  /// that norm. Collective over the tensor group; every rank calls it at the same points.
  double flush();
  /// \brief comm.priority: one line on the pieces started since the last call (buckets in the
  /// order sent, run-length) and how the forwards ran (units run with pieces in flight, time
  /// waited for a bucket); empty otherwise.
  std::string take_priority_report();

  // nn::LayerHooks
  void before_forward(std::size_t unit) override;
  void after_forward(std::size_t unit) override;
  void before_backward(std::size_t unit) override;
  void after_backward(std::size_t unit) override;

  Optimizer& optimizer() { return opt_; }
  const Optimizer& optimizer() const { return opt_; }
  const Sharding& sharding() const { return sharding_; }

  /// Seconds spent inside the hooks (gathers, starting, testing and completing exchanges) since
  /// the last call.
  double take_hook_comm_seconds();
  /// Seconds of the last finish_step spent waiting for or doing communication, and updating.
  double last_comm_seconds() const { return last_comm_s_; }
  double last_update_seconds() const { return last_update_s_; }

 private:
  struct BucketState;
  void bucket_ready(std::size_t b);
  void start_exchange(std::size_t b, bool blocking);
  /// Moves bucket b's exchange on as far as it can go (wait: to its end): from the sum in the
  /// sharding group to the one across nodes (hybrid sharding), then to exchanged().
  void advance(std::size_t b, bool wait);
  void complete(std::size_t b);
  void poll();
  void wait_all();
  /// Sums a tied parameter's gradient (the first stage's original, the last stage's copy).
  void sum_tied_gradients(const ExecSpace& exec);

  // comm.priority
  struct Flight;
  void start_pieces();
  void retire_oldest();
  void test_pieces();
  void piece_done(std::size_t b);
  void apply_done();
  void apply(std::size_t b);
  /// Retires pieces oldest first until bucket b has none left (or every bucket: npos), applies.
  void wait_bucket(std::size_t b);
  void finalize_norm();

  const Config& cfg_;
  const Communicator& comm_;
  nn::ParamStore<float>& store_;
  Sharding& sharding_;
  Optimizer opt_;
  ExecSpace exec_;
  bool overlap_ = true, no_sync_ = true, sync_ = true, blocking_allreduce_ = false;
  std::vector<BucketState> buckets_;
  Vector<float> tied_recv_;    // the other stage's gradient of a tied parameter
  double hook_comm_s_ = 0.0, last_comm_s_ = 0.0, last_update_s_ = 0.0;
  std::size_t last_started_ = static_cast<std::size_t>(-1);  // the newest exchange started
  bool skipped_ = false;

  bool priority_ = false;
  std::unique_ptr<PieceScheduler> sched_;
  std::deque<Flight> flight_;           // the pieces in flight, oldest first (sched_'s order)
  std::vector<std::size_t> undone_;     // per bucket: pieces not yet seen complete
  std::vector<char> pending_;           // per bucket: exchanged this step, not yet applied
  bool updates_open_ = false;           // finish_step began the step's update: lr_ holds
  bool norm_open_ = false;              // squares_ of a finished step not yet reduced
  bool nonfinite_ = false;
  double lr_ = 0.0, squares_ = 0.0, last_norm_ = 0.0;
  std::vector<std::size_t> trace_;      // buckets of the pieces started since the last report
  std::size_t forward_units_ = 0, forward_overlapped_ = 0;
  double forward_wait_s_ = 0.0;
};

}  // namespace tessera
