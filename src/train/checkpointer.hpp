#pragma once
// Checkpoints of a run (DESIGN.md "Checkpoints"): <output_dir>/checkpoints/step_<8 digits>.h5,
// written collectively as a temporary file and renamed, `latest` naming the newest complete one,
// the newest `keep` kept. Model tensors and optimizer state are stored in their logical shapes;
// each rank writes the rows it owns, so no element is written twice.
#include <cstdint>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "comm/communicator.hpp"
#include "core/config.hpp"
#include "io/checkpoint_file.hpp"
#include "optim/optimizer.hpp"
#include "train/sharding.hpp"
#include "train/field_norm.hpp"
#include "train/model.hpp"

namespace tessera {

/// Where training stands; everything else (data order, learning rate) derives from it.
struct TrainState {
  std::int64_t step = 0;            ///< optimizer steps done
  std::int64_t epoch = 0;           ///< epoch of the next batch
  std::int64_t batch_in_epoch = 0;  ///< index of the next global batch in its epoch
  std::int64_t samples_seen = 0;
  // fp16's dynamic loss scale (train.precision = "fp16"); 1 and unused otherwise.
  double loss_scale = 1.0;
  std::int64_t loss_scale_good_steps = 0;  ///< finite steps since the scale last changed
  std::int64_t skipped_steps = 0;          ///< steps whose update an overflow skipped
};

/// What `--resume auto` continues from.
struct LatestCheckpoint {
  std::string path;  ///< the checkpoint, or "" for a fresh start
  std::string note;  ///< why it is not what `latest` names (for the log), or ""
};

class Checkpointer {
 public:
  Checkpointer(const Config& cfg, const Communicator& comm);
  ~Checkpointer();

  /// <output_dir>/checkpoints
  const std::string& dir() const { return dir_; }
  /// \brief The checkpoint `--resume auto` continues from: the one `latest` names (which must
  /// exist); where `latest` cannot be read (missing, empty, a directory, not a file name), the
  /// newest step_*.h5 file, which must look resumable; "" where there is no step file at all.
  /// InputError where the newest checkpoint cannot be resumed: a run never starts over on top of
  /// checkpoints it could not read. Collective over world (rank 0 looks, everyone learns).
  LatestCheckpoint find_latest() const;

  /// \brief Before the first step of a run that continues from `from_step` (0: a fresh run): every
  /// path a later save writes can be written. `latest`, `latest.tmp`, and step_<N>.h5 and
  /// step_<N>.h5.tmp for every N > from_step (a stop signal may save any step) are absent or
  /// files, and the directory (the run directory where checkpoints/ does not exist yet) takes a
  /// new file (one is created and removed). Otherwise an InputError on every rank naming the path;
  /// nothing of the run directory changes. Collective over world (rank 0 looks).
  void check_writable(std::int64_t from_step) const;

  /// \brief Writes step_<step>.h5, points `latest` at it and keeps the newest `keep` of this
  /// run's checkpoints: those it wrote and those of the run it resumed, up to the step it resumed
  /// from; a checkpoint of anything else is never deleted. Collective over world; any failure
  /// (an InputError naming the file that could not be written) is thrown on every rank. Returns
  /// the path written.
  std::string save(const Model& model, const Sharding& sharding, const Optimizer& opt, const TrainState& state);

  /// \brief The first half of an asynchronous save (checkpoint.async): copies what this rank
  /// owns into host staging buffers, computes the checksums, creates the file's layout (metadata
  /// and allocated datasets, io::create_checkpoint_layout) and starts a thread that writes the
  /// values; returns at once. Training may change the model as soon as it returns. One save may
  /// be in flight: finish_save() the last first. Collective over world.
  void begin_save(const Model& model, const Sharding& sharding, const Optimizer& opt, const TrainState& state);
  /// \brief True between begin_save() and finish_save().
  bool save_in_flight() const { return pending_ != nullptr; }
  /// \brief True once this rank's writer has finished (or no save is in flight). Local.
  bool save_written() const;
  /// \brief Completes the save in flight: waits for this rank's writer, then (every rank's part
  /// written and synced) renames the file into place, points `latest` at it and prunes, as save()
  /// does. A write that failed on any rank is an InputError on every rank and leaves `latest` on
  /// the previous checkpoint. Collective over world. Returns the path written.
  std::string finish_save();

  /// \brief Loads parameters and optimizer state from `path` into model and opt (where `sharding`
  /// says they live); collective.
  /// Validates before anything is used: exactly the deck's tensors with its shapes (model and
  /// optimizer state), the optimizer kind, every /train and /optimizer value in its range, and
  /// every tensor's values against its checksum and for NaN or infinities. InputError on every
  /// rank naming the file and the first problem. Any ZeRO stage reads any checkpoint: a shard
  /// reads only its pieces.
  TrainState load(const std::string& path, Model& model, Sharding& sharding, Optimizer& opt);

  /// \brief Loads only the parameters (evaluation; sharding where they are sharded), validated as load()
  /// does. Collective.
  void load_model(const std::string& path, Model& model, Sharding* sharding = nullptr) const;

 private:
  /// This rank's values or one optimizer state to write from: a host copy, or (`read` set) read
  /// range by range where it is needed (an offload file: never in memory whole).
  struct Source {
    const float* data = nullptr;
    std::function<void(std::size_t at, std::size_t n, float* out)> read;
    Source(const float* host = nullptr) : data(host) {}  // NOLINT(google-explicit-constructor): a host copy
    explicit operator bool() const { return data != nullptr || static_cast<bool>(read); }
  };
  /// This rank's slab of every checkpoint tensor, in the file's order: the model's (if values is
  /// given) and then, per parameter, its optimizer states (one source per state, named by
  /// state_names); each from the given sources (full, or this rank's shard where `sharding`
  /// shards them; nullptr: full).
  std::vector<io::TensorSlab> slabs(const Model& model, const Sharding* sharding, const Source& values,
                                    const std::vector<Source>& states,
                                    const std::vector<std::string>& state_names) const;
  /// Checks the slabs this rank read against the file's checksums (collective).
  void verify(const io::CheckpointFile& file, const std::vector<io::TensorSlab>& owned) const;
  /// Drops stale temporary files and the checkpoints of this run beyond `keep`. Rank 0.
  void prune() const;
  /// The root and group attributes of a checkpoint of `state`, and this rank's slabs of values
  /// and states (host copies) in the file's order, then the model's normalisation statistics
  /// (`norm`: field_norm_values of the model's; none where it has none), written by rank 0.
  io::CheckpointContent content(const Model& model, const Sharding& sharding, const Optimizer& opt,
                                const TrainState& state, const Source& values, const std::vector<Source>& states,
                                const FieldNormValues& norm) const;
  /// After the file is renamed into place: `latest` names it, old ones are pruned (rank 0, agreed).
  void record_latest(const std::string& path);

  struct PendingSave;
  std::unique_ptr<PendingSave> pending_;  ///< the asynchronous save in flight

  const Config& cfg_;
  const Communicator& comm_;
  std::string dir_;
  std::set<std::int64_t> written_;   ///< steps this process saved
  std::int64_t resumed_from_ = -1;   ///< the step load() resumed, or -1
};

}  // namespace tessera
