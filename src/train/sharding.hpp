#pragma once
// Where every piece of the training state lives: the one owner of parallel.zero.
//
// The replica group holds every rank with the same parameters (data x spatial); the sharding
// spreads the training state over it:
//   zero 0  every rank holds all values, gradients and optimizer state; a bucket's gradients
//           are allreduced in place.
//   zero 1  optimizer state only for this rank's shard: a bucket's gradients are reduce-scattered
//           into a gradient shard, the shard is updated, and the updated chunks allgathered.
//   zero 2  as 1, and no full gradient buffer: a bucket's gradients live in a working buffer
//           from the start of its backward until its reduce-scatter is done (a rank alone in
//           its group with one exchange per step accumulates them in its shard itself).
//   zero 3  as 2, and no full value buffer: a bucket's values are gathered just before its
//           forward and its backward and released after.
// A rank's shard is the rank's chunk of every bucket (nn::ParamStore::plan).
//
// parallel.zero_group = "node" (hybrid sharding, FSDP's HYBRID_SHARD): the state is spread over
// the replica ranks of one node only (Group::replica_node) and replicated across nodes: a bucket is
// reduce-scattered inside the node, and each shard's chunk then allreduced once across nodes
// among the ranks holding the same shard (Group::replica_cross); gathers stay inside the node.
//
// Built first, from the deck and the communicator, it says how the model's store is planned and
// allocated (layout()); bound to that store it allocates the shard buffers and answers the
// optimizer.offload_values (at zero 3, with optimizer.offload = "disk"): the value shard lives in a
// scratch file per rank (optim/state_file.hpp) instead of memory; a bucket's chunk is read from it
// just before the bucket's gather, and the optimizer streams it beside its state (update_spans()
// then name no values in memory). Memory holds only the gathered buckets and a small buffer.
//
// parallel.zero_prefetch (zero 3, on by default): while a bucket computes, the gather of the
// bucket the model will ask for next is already under way (a nonblocking allgather; with the
// values on disk, the chunk's read on an I/O thread, then the allgather when it is asked for). Which
// bucket comes next is learnt from the gathers themselves: every step's buckets are gathered in the
// same order (the model's passes and the pipeline schedule repeat), so the step remembers the order
// of the last one, and where its k-th gather is the same bucket as the last step's k-th, it starts
// the last step's (k+1)-th, unless the update came between; out of that order (the first step, an
// evaluation's gathers), the bucket that came after this one the last time. At most one bucket is ahead at a time (one more gathered bucket held),
// and one asked for out of turn is gathered as without it. The values do not change while a bucket is ahead: the update and
// a resume's set_values() drop it first (before_update()). The values gathered are the same bits
// either way.
//
// questions of the exchange (gradient_exchange.hpp), the optimizer step (optimizer_step.hpp) and the checkpointer: where a
// bucket's gradient accumulates and where its exchange delivers it, which spans the optimizer
// updates and what is gathered after, and which element pieces this rank reads and writes. None
// of them looks at the stage.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.hpp"
#include "core/config.hpp"
#include "kernels/views.hpp"
#include "nn/param_store.hpp"
#include "train/buffer_pool.hpp"
#include "train/model.hpp"

namespace tessera {

class StateFile;
class StateIo;

class Sharding {
 public:
  /// A piece of one parameter that this rank's shard holds: logical elements [begin, end) of
  /// parameter `param`, at shard elements [shard_offset, shard_offset + end - begin).
  struct Piece {
    std::size_t param = 0;
    std::size_t begin = 0, end = 0;
    std::size_t shard_offset = 0;
  };

  /// What one bucket's gradient exchange moves: `send` holds the bucket (`length` elements, the
  /// same on every rank of the group); the sum over group() lands in `recv`: the whole bucket in
  /// place (scatter false, recv == send) or this rank's chunk of it (scatter true, `chunk`
  /// elements). across_nodes: the chunk in `recv` is then summed in place over Group::replica_cross.
  struct Exchange {
    float* send = nullptr;
    float* recv = nullptr;
    std::size_t length = 0, chunk = 0;
    bool scatter = false;
    bool across_nodes = false;
  };

  /// One contiguous span the optimizer updates: values and their reduced gradients, at
  /// `state_offset` in the optimizer's state. values is nullptr where they live in value_file(),
  /// at the same offsets as the state.
  struct UpdateSpan {
    float* values = nullptr;
    float* grads = nullptr;
    std::size_t n = 0;
    std::size_t state_offset = 0;
  };

  /// optimizer.offload_values: the value file's reads and writes go through a buffer of this many
  /// floats (1 MiB); a read ahead (parallel.zero_prefetch) through a second one.
  static constexpr std::size_t kValueBuffer = 256 * 1024;

  /// What the gathers did since bind(): buckets gathered (not already held), how many of them had
  /// been gathered ahead, how many gathered ahead were dropped unused, and the seconds gather()
  /// spent (on a bucket gathered ahead: waiting for what was not yet done).
  struct GatherCounts {
    double gathers = 0, ahead = 0, dropped = 0, seconds = 0;
  };

  /// \brief The plan of this deck on this communicator; allocates nothing. InputError (on every
  /// rank) where parallel.zero_group = "node" and the nodes hold different numbers of replicas.
  Sharding(const Config& cfg, const Communicator& comm);
  ~Sharding();
  Sharding(const Sharding&) = delete;
  Sharding& operator=(const Sharding&) = delete;

  /// How the model's store must be planned and allocated (shards, bucket size, buffers).
  const ParamLayout& layout() const { return layout_; }
  /// The same from the deck alone, for `shards` ranks sharing the state (memory estimates).
  static ParamLayout layout(const Config& cfg, int shards);
  /// With several micro-batches a rank's gradient shard receives a sum per micro-batch and adds
  /// it up (every one at zero >= 2, where there is no full buffer to accumulate in; every one
  /// without comm.no_sync at zero 1).
  static bool accumulates_into_shard(const Config& cfg);
  /// Zero >= 2 alone in its group (`shards` 1) with one exchange per step: a bucket's gradients
  /// accumulate straight into the gradient shard, and the exchange has nothing to sum.
  static bool grads_in_shard(const Config& cfg, int shards);

  /// \brief Takes the store planned and allocated from layout() and allocates the shard buffers
  /// (optimizer.offload_values: makes the value file; InputError on this rank where it cannot).
  /// Throws std::logic_error where the store was planned otherwise.
  void bind(nn::ParamStore<float>& store);

  /// The group the state is spread over, its size and this rank's index in it.
  Group group() const { return group_; }
  int shards() const { return shards_; }
  int rank() const { return rank_; }
  /// One phrase for the log: "ZeRO stage 2 over the replica group (4 ranks)".
  std::string describe() const;

  /// Only this rank's shard of the values is held between uses (gathered per bucket).
  bool values_sharded() const { return values_sharded_; }
  /// No full gradient buffer: a bucket's gradients live in a working buffer while needed.
  bool grads_sharded() const { return grads_sharded_; }
  /// The optimizer state is held for this rank's shard only.
  bool state_sharded() const { return state_sharded_; }
  /// Elements of optimizer state this rank holds.
  std::size_t state_size() const;

  /// \brief Initial values from (seed, name, index): the full buffer, or this rank's shard.
  void initialize(const ExecSpace& exec, std::uint64_t seed);
  /// Elements of the values this rank holds between steps: the full buffer or its shard.
  std::size_t values_size() const;
  /// \brief Copies `n` of them from element `at` into `out` (on the host), from memory or the file.
  void copy_values(std::size_t at, std::size_t n, float* out) const;
  /// \brief Sets `n` of them from element `at` from `in` (on the host).
  void set_values(std::size_t at, std::size_t n, const float* in);
  /// optimizer.offload_values: the file the value shard lives in (nullptr: in memory).
  StateFile* value_file() const { return value_file_.get(); }
  /// Where the values live, for the run log ("memory", "disk, ...").
  std::string describe_values() const;
  /// Bytes the gathers read from the value file so far.
  double value_bytes_read() const { return gather_read_; }

  // The gradients of one step.
  /// \brief Clears every gradient accumulator.
  void begin_step(const ExecSpace& exec);
  /// \brief Before the backward of a micro-batch that is exchanged after earlier ones of the same
  /// step were (no_sync off): prepares the accumulators so the next exchange adds, not replaces.
  void prepare_resync(const ExecSpace& exec, bool first_micro_batch);
  /// \brief Before bucket b's backward: true where its gradients need a working buffer now.
  bool needs_grad_buffer(std::size_t b) const;
  /// \brief Gives bucket b a working gradient buffer (grads_sharded()).
  void attach_grad_buffer(std::size_t b);
  /// \brief What bucket b's exchange moves.
  Exchange exchange(std::size_t b);
  /// \brief After bucket b's exchange completed: its result folded into the gradient shard, its
  /// working buffer freed.
  void exchanged(const ExecSpace& exec, std::size_t b);
  /// \brief Bucket b's reduced gradient as this rank holds it (the whole bucket or its chunk).
  VectorU<float> reduced(std::size_t b) const;
  /// \brief The sum of squares of the logical gradients of the parameters `counted` marks (one
  /// flag per parameter; the optimizer step decides which count on this rank): the part this rank
  /// holds, summed over the sharding group. Collective over group() where the gradients are
  /// sharded.
  double grad_squares(const ExecSpace& exec, const std::vector<char>& counted) const;
  /// \brief The spans the optimizer updates on this rank.
  std::vector<UpdateSpan> update_spans() const;
  /// \brief Bucket b's part of them: the whole bucket, or this rank's chunk where the state is
  /// sharded.
  UpdateSpan bucket_span(std::size_t b) const;
  /// \brief After the update: every rank gets what the others updated (allgather of the chunks
  /// where values are full but the update sharded). Collective over group().
  void after_update(const ExecSpace& exec);

  // Values of a sharded model (values_sharded()).
  /// \brief Gathers bucket b's values (collective over group()); nothing where held. With
  /// parallel.zero_prefetch, then starts the gather of the bucket that followed it in the last step.
  void gather(const ExecSpace& exec, std::size_t b);
  /// \brief Releases bucket b's gathered values.
  void release(const ExecSpace& exec, std::size_t b);
  /// \brief Lets a gather started ahead move on (MPI progresses a nonblocking collective only
  /// inside its calls); the exchange calls it from its hooks.
  void progress();
  /// \brief The values are about to change (the update): a bucket gathered ahead is dropped.
  void before_update();
  /// Buckets are gathered ahead of their use (parallel.zero_prefetch, where it applies).
  bool gathers_ahead() const { return prefetch_; }
  /// The same from the deck, for `shards` ranks sharing the state: zero 3 with zero_prefetch where
  /// a gather moves anything (over more than one rank, or from the value file), in host memory.
  static bool gathers_ahead(const Config& cfg, int shards);
  GatherCounts gather_counts() const { return counts_; }

  /// \brief Every parameter's piece in this rank's shard, in parameter order.
  std::vector<Piece> pieces() const;
  /// \brief This rank writes its pieces to a checkpoint (one holder of each shard does: the first
  /// node's under hybrid sharding).
  bool writes_pieces() const { return writes_pieces_; }

 private:
  // Elements [begin, begin + count) of the value file, through the block-aligned buffer.
  void read_values(std::size_t begin, std::size_t count, float* out) const;
  void write_values(std::size_t begin, std::size_t count, const float* in);

  struct BucketBuffers {
    float* grads = nullptr;     // grads_sharded(): this bucket's gradients while needed
    float* gathered = nullptr;  // values_sharded(): this bucket's values while gathered
  };
  const Communicator& comm_;
  Group group_ = Group::replica;  // before layout_: the plan's shard count is its size
  ParamLayout layout_;
  nn::ParamStore<float>* store_ = nullptr;
  int zero_ = 0;
  bool across_nodes_ = false;  // hybrid sharding over more than one node
  int shards_ = 1, rank_ = 0;
  bool writes_pieces_ = true;
  bool values_sharded_ = false, grads_sharded_ = false, state_sharded_ = false;
  bool accumulate_into_shard_ = false;  // an exchange per micro-batch adds into the shard
  // Alone in the group with one exchange per step (grads_sharded()): a bucket's gradients
  // accumulate straight into the gradient shard, and the exchange has nothing to sum.
  bool grads_in_shard_ = false;
  std::vector<BucketBuffers> buckets_;
  BufferPool grad_buffers_;    // grads_sharded() and not grads_in_shard_
  BufferPool gather_buffers_;  // values_sharded()
  Vector<float> value_shard_;  // values_sharded()
  Vector<float> grad_shard_;   // state_sharded()
  Vector<float> recv_;         // accumulating: each bucket's chunk of this micro-batch
  // optimizer.offload_values.
  std::string value_dir_;      // the file's directory ("": the values live in memory)
  int world_rank_ = 0;
  std::unique_ptr<StateFile> value_file_;
  Vector<float> value_chunk_;  // shards_ > 1: a bucket's chunk read from the file, to be gathered
  struct FreeFloats {
    void operator()(float* p) const;
  };
  std::unique_ptr<float, FreeFloats> bounce_;  // kBounce floats, aligned to the file's blocks
  mutable double gather_read_ = 0.0;
  // parallel.zero_prefetch.
  static constexpr std::size_t kNone = static_cast<std::size_t>(-1);
  static constexpr std::size_t kOrderBound = 1 << 20;
  // Completes the bucket gathered ahead into its buffer (collective like gather()).
  void finish_ahead();
  // Starts gathering bucket b ahead of its use.
  void start_ahead(std::size_t b);
  // Waits for a read ahead from the value file (its result kept); errors are left to finish_ahead().
  void settle_read() const;
  // Waits for the bucket gathered ahead and gives its buffer back.
  void drop_ahead();
  bool prefetch_ = false;
  std::vector<std::size_t> order_, last_order_;  // the buckets gathered this step and in the last
  std::vector<std::size_t> follows_;  // per bucket: the one gathered after it the last time
  std::size_t previous_ = kNone;     // the bucket gathered last
  std::size_t update_at_ = kNone, last_update_at_ = kNone;  // gathers before the update, this step and the last
  struct Ahead {
    std::size_t bucket = kNone;
    float* buffer = nullptr;
    PendingOp op;                  // in memory: the allgather
    std::uint64_t ticket = 0;      // on disk: the chunk's read
    bool read_settled = true;      // the read is done and its bytes counted
    double read_before = 0;        // the file's bytes read when it started
  };
  mutable Ahead ahead_;
  std::unique_ptr<StateIo> value_io_;             // the reads ahead (made at the first)
  std::unique_ptr<float, FreeFloats> ahead_bounce_;  // their buffer, kBounce floats
  GatherCounts counts_;
};

}  // namespace tessera
