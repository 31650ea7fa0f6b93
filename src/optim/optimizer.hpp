#pragma once
// Optimizers over the flat parameter buffer: one kernel per step for the whole model (or per piece:
// a ZeRO shard's chunks, a bucket). The state lives with the parameters; with optimizer.offload =
// "disk" in a scratch file per rank (optim/state_file.hpp) that each update streams through a
// bounded host buffer in tiles; with "host" on a GPU build in host memory, the update run on the
// host with the gradients copied down and the parameters copied up tile by tile (the same staging
// carries a GPU build's disk offload). Where the parameter values themselves live in a file
// (optimizer.offload_values: the Sharding's value file), the update streams them beside the state.
// The same per-element kernel on the same values, so the same bits.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/config.hpp"
#include "kernels/optimizer.hpp"
#include "kernels/views.hpp"

namespace tessera {

class StateFile;
class StateIo;

/// optimizer.offload: how `states` state buffers of `n` floats each (on disk) and, where the
/// parameters are not in host memory (`staged`), the parameters' and gradients' tiles stream
/// through optimizer.offload_buffer_mb. The one rule the optimizer follows and the memory estimate
/// asks.
struct OffloadPlan {
  std::size_t depth = 1;    ///< tiles of each stream held: 3 with offload_overlap (updated, read, written)
  std::size_t tile = 0;     ///< elements per tile: whole 4 KiB blocks, at least one, at most `padded`
  std::size_t padded = 0;   ///< elements of each buffer on disk: n rounded up to whole blocks
  /// float streams through the buffer: the states on disk, the values where they are on disk too,
  /// and where staged the gradients and (unless on disk) the values
  std::size_t streams = 0;
  bool staged = false;      ///< the parameters and gradients (and their bf16 copies) staged
  /// Bytes of host buffer the plan holds: every stream's tiles, the bf16 copies' included.
  double buffer_bytes() const;
};
/// `values`: the parameter values stream from a file too (optimizer.offload_values, at zero 3).
OffloadPlan offload_plan(const OptimizerConfig& cfg, std::size_t states, std::size_t n, bool staged = false,
                         bool values = false);
/// \brief Whether optimizer.offload streams the parameters and gradients through host tiles: on a
/// build whose parameters are not in host memory (a GPU), or where TESSERA_TEST_STAGE_OFFLOAD
/// asks it of a CPU build.
bool offload_staged(const OptimizerConfig& cfg);

class Optimizer {
 public:
  /// \param n elements of state per buffer: the flat parameter buffer, or a ZeRO shard of it.
  /// \param rank this process's world rank (the offload file's name).
  /// \param values where the parameter values live in a file (of one array of n floats): every
  /// update() then streams them from it (its `params` have no data).
  /// InputError (this rank only) where optimizer.offload = "disk" and its file cannot be made.
  Optimizer(const OptimizerConfig& cfg, std::size_t n, int rank = 0, StateFile* values = nullptr);
  ~Optimizer();
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  /// \brief A step in pieces: begin_step() counts it (AdamW's bias correction uses the count),
  /// then update() for each piece; a piece's state is the state's elements from state_offset on.
  void begin_step() {
    ++steps_;
    ++traffic_.steps;
  }
  /// `extras`: a factor on the gradients and the bf16 copies written in the same pass
  /// (kernels::UpdateExtras). Offloaded: the piece's state is read, updated and written back tile by
  /// tile; InputError naming the file and the rank on an I/O error.
  void update(const ExecSpace& exec, VectorU<float> params, VectorU<float> grads, double lr,
              std::size_t state_offset, const kernels::UpdateExtras& extras = {});

  std::int64_t steps() const { return steps_; }
  void set_steps(std::int64_t s) { steps_ = s; }
  /// "sgd" or "adamw", as stored in checkpoints.
  std::string kind_name() const;
  /// Names of the per-element state buffers: {"momentum"} for SGD with momentum,
  /// {"exp_avg", "exp_avg_sq"} for AdamW, none for plain SGD.
  const std::vector<std::string>& state_names() const { return names_; }
  /// Elements of each state buffer.
  std::size_t size() const { return n_; }

  /// \brief Copies state buffer i into `out` (size() floats).
  void copy_state(std::size_t i, float* out) const { copy_state(i, 0, n_, out); }
  /// \brief Copies `n` elements of state buffer i from element `at` into `out` (on the host).
  void copy_state(std::size_t i, std::size_t at, std::size_t n, float* out) const;
  /// \brief Sets state buffer i from `in` (size() floats on the host).
  void set_state(std::size_t i, const float* in) { set_state(i, 0, n_, in); }
  /// \brief Sets `n` elements of state buffer i from element `at` from `in` (on the host).
  void set_state(std::size_t i, std::size_t at, std::size_t n, const float* in);

  /// The offload file, or nullptr where the state lives in memory.
  StateFile* offload_file() const { return file_.get(); }
  /// Whether an update reads and writes files (the state's, the values'), and so may fail on I/O.
  bool streams_files() const { return file_ != nullptr || values_ != nullptr; }
  /// Where the state lives and how it streams, for the run log ("memory", "host, ...", "disk, ...").
  std::string describe_offload() const;
  /// What this process's updates read from and wrote to the offload file, their seconds (the tile
  /// loops' wall time, I/O waits, copies and updates together) and the steps they made.
  struct Traffic {
    double read = 0, written = 0, seconds = 0;
    std::int64_t steps = 0;
  };
  const Traffic& traffic() const { return traffic_; }

 private:
  struct AlignedFree {
    void operator()(float* p) const;
  };
  OptimizerConfig cfg_;
  std::size_t n_ = 0;
  std::int64_t steps_ = 0;
  std::vector<std::string> names_;
  std::vector<Vector<float>> states_;  // with the parameters
  std::vector<Kokkos::View<float*, PinnedSpace>> host_states_;  // optimizer.offload = "host", staged
  std::unique_ptr<StateFile> file_;    // optimizer.offload = "disk"
  std::unique_ptr<StateIo> io_;        // its reads and writes, beside the updates
  StateFile* values_ = nullptr;        // the parameter values' file (optimizer.offload_values)
  std::unique_ptr<StateIo> values_io_;  // its reads and writes in the updates
  std::size_t padded_ = 0;             // elements of each array in the files
  std::size_t tile_ = 0;               // elements per state per tile
  std::size_t depth_ = 1;              // tiles per state in the buffer: 3 with offload_overlap
  // Tile b of state s at s * depth_ + b; the values' (values_) after the states'.
  std::vector<std::unique_ptr<float, AlignedFree>> tiles_;
  bool staged_ = false;  // parameters and gradients copied through host tiles
  // Staging, tile b at b: the parameters', the gradients' and the bf16 copies'.
  std::vector<Kokkos::View<float*, PinnedSpace>> stage_p_, stage_g_;
  std::vector<Kokkos::View<std::uint16_t*, PinnedSpace>> stage_bf16_;
  Traffic traffic_;
};

}  // namespace tessera
