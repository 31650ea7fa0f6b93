#pragma once
// Checkpoints of a run (DESIGN.md "Checkpoints"): <output_dir>/checkpoints/step_<8 digits>.h5,
// written collectively as a temporary file and renamed, `latest` naming the newest complete one,
// the newest `keep` kept. Model tensors and optimizer state are stored in their logical shapes;
// each rank writes the rows it owns, so no element is written twice.
#include <cstdint>
#include <string>

#include "comm/communicator.hpp"
#include "core/config.hpp"
#include "train/data_parallel.hpp"
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

class Checkpointer {
 public:
  Checkpointer(const Config& cfg, const Communicator& comm);

  /// <output_dir>/checkpoints
  const std::string& dir() const { return dir_; }
  /// \brief Path of the newest complete checkpoint named by `latest`, or "" if none.
  /// Collective over world (rank 0 looks, everyone learns the answer).
  std::string find_latest() const;

  /// \brief Writes step_<step>.h5, updates `latest` and drops checkpoints beyond `keep`.
  /// Collective over world. Returns the path written.
  std::string save(const Model& model, const DataParallel& dp, const TrainState& state) const;

  /// \brief Loads parameters and optimizer state from `path` into model and opt; collective.
  /// Throws InputError naming the first tensor that does not fit the model, or the optimizer
  /// kind when it differs from the deck's.
  /// Any ZeRO stage reads any checkpoint: a shard reads only its pieces.
  TrainState load(const std::string& path, Model& model, DataParallel& dp) const;

  /// \brief Loads only the parameters (evaluation; dp when they are sharded). Collective.
  void load_model(const std::string& path, Model& model, DataParallel* dp = nullptr) const;

 private:
  const Config& cfg_;
  const Communicator& comm_;
  std::string dir_;
};

}  // namespace tessera
