#pragma once
// The data-parallel step over one model's ParamStore: bucketed gradient exchange overlapped with
// backward, no-sync accumulation, ZeRO stages 1-3 over the replica group, clipping and the optimizer.
// The replica group holds every rank with the same parameters: the data group, times the spatial
// group where samples are split over ranks (parallel.spatial: each holds a block of every
// sample's grid, so its gradients are partial sums that this exchange completes).
//
//   zero 0  every rank holds all values, gradients and optimizer state; buckets are allreduced.
//   zero 1  optimizer state only for this rank's shard: buckets are reduce-scattered into a
//           gradient shard, the shard is updated, and each bucket's values allgathered.
//   zero 2  as 1, and no full gradient buffer: a bucket's gradients live in a working buffer from
//           the start of its backward until its reduce-scatter is done (every micro-batch); at
//           most two at once (the one filling, the newest in flight).
//   zero 3  as 2, and no full value buffer: a bucket's values are gathered just before its
//           forward and its backward and released after.
//
// A rank's shard is the rank's chunk of every bucket (nn::ParamStore::plan). Each bucket is
// exchanged from the backward hook that completes it: with comm.overlap on, by MPI's nonblocking
// collective, completed later (the bucket of the first layer, last to fill, blocking); with it
// off, or with zero 0 and comm.allreduce = ring | parameter-server, by a blocking call there.
#include <cstddef>
#include <vector>

#include "comm/communicator.hpp"
#include "core/config.hpp"
#include "nn/hooks.hpp"
#include "nn/param_store.hpp"
#include "optim/optimizer.hpp"

namespace tessera {

class DataParallel final : public nn::LayerHooks {
 public:
  /// How a store must be planned and allocated for this deck before it is handed over.
  static int shards(const Config& cfg, const Communicator& comm);
  static std::size_t bucket_elements(const Config& cfg);
  static nn::Storage storage(int zero);

  /// \brief Takes over `store` (planned with shards() and bucket_elements(), allocated with
  /// storage()). Collective over the replica group only through later calls.
  DataParallel(const Config& cfg, const Communicator& comm, nn::ParamStore<float>& store);
  ~DataParallel() override;

  /// \brief Initial values from (seed, name, index): the full buffer, or this rank's shard.
  void initialize(const ExecSpace& exec, std::uint64_t seed);

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

  // nn::LayerHooks
  void before_forward(std::size_t unit) override;
  void after_forward(std::size_t unit) override;
  void before_backward(std::size_t unit) override;
  void after_backward(std::size_t unit) override;

  Optimizer& optimizer() { return opt_; }
  const Optimizer& optimizer() const { return opt_; }
  int zero() const { return zero_; }
  /// This rank's index in the replica group (the shard count when zero >= 1 is its size).
  int shard_rank() const { return shard_rank_; }
  /// zero 3: this rank's values (shard_size() elements); empty otherwise.
  Vector<float> value_shard() const { return value_shard_; }

  /// A piece of one parameter that this rank's shard holds: logical elements [begin, end) of
  /// parameter `param`, at shard elements [shard_offset, shard_offset + end - begin).
  struct Piece {
    std::size_t param = 0;
    std::size_t begin = 0, end = 0;
    std::size_t shard_offset = 0;
  };
  /// Every parameter's piece in this rank's shard (zero >= 1), in parameter order.
  std::vector<Piece> shard_pieces() const;

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
  void complete(std::size_t b);
  void poll();
  void wait_all();
  void gather(std::size_t b);
  void release_values(std::size_t b);
  /// Sums a tied parameter's gradient (the first stage's original, the last stage's copy).
  void sum_tied_gradients(const ExecSpace& exec);

  const Config& cfg_;
  const Communicator& comm_;
  nn::ParamStore<float>& store_;
  Optimizer opt_;
  ExecSpace exec_;
  int zero_ = 0, shard_rank_ = 0, shards_ = 1;
  bool overlap_ = true, no_sync_ = true, sync_ = true, accumulate_into_shard_ = false;
  std::vector<BucketState> buckets_;
  Vector<float> value_shard_;  // zero 3
  Vector<float> grad_shard_;   // zero >= 1
  Vector<float> recv_;         // zero >= 1 accumulating: each bucket's chunk of this micro-batch
  Vector<float> tied_recv_;    // the other stage's gradient of a tied parameter
  double hook_comm_s_ = 0.0, last_comm_s_ = 0.0, last_update_s_ = 0.0;
  std::size_t last_started_ = static_cast<std::size_t>(-1);  // the newest exchange started
  bool skipped_ = false;
};

}  // namespace tessera
