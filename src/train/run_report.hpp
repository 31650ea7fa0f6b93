#pragma once
// The run's books: where the time of the training steps went (the phase timer and the tensor
// group's sums), the samples and seconds behind every rate, the bytes each group's communication
// and the halo exchanges moved per training step, and the clocks behind the ETA and wall_s. The
// trainer marks the steps and asks it for a progress line's numbers (take_interval) and for the
// summary's fields (add_to_summary); the pipeline executor and the model add to its timer.
#include <array>
#include <cstdint>
#include <optional>

#include <nlohmann/json.hpp>

#include "comm/communicator.hpp"
#include "core/config.hpp"
#include "nn/halo.hpp"
#include "train/run_output.hpp"
#include "train/step_timer.hpp"

namespace tessera {

class RunReport {
 public:
  /// Starts the run's clock (summary.json's wall_s, the metrics' wall_s).
  RunReport();

  /// The phase timer of the steps since the last progress line.
  StepTimer& timer() { return timer_; }
  /// Seconds in tensor-group sums since the last take (the model's tensor-parallel layers add to it).
  double* tensor_seconds() { return &tensor_seconds_; }

  /// \brief The training loop begins at `step` (0, or the step resumed): the ETA's clock.
  void begin_loop(std::int64_t step);

  /// What a step's bookkeeping needs from its start.
  struct StepMark {
    double start = 0.0;
    nn::HaloStats halo;
    CommCounters comm;
  };
  /// \brief Before a training step: the clock and the counters.
  /// `neighbours`: the stats of the model's point-to-point exchange (a U-Net's halo, a ring), if any.
  StepMark begin_step(const Communicator& comm, const std::optional<nn::HaloStats>& neighbours) const;
  /// \brief After it: its seconds, samples, bytes and point-to-point exchanges counted.
  void end_step(const StepMark& mark, const Communicator& comm, const std::optional<nn::HaloStats>& neighbours,
                std::int64_t samples);

  /// \brief The numbers of a progress line at `step` of `total_steps`, over the steps since the
  /// previous line (the loop's start if none): the rate, the ETA (eta_seconds), and a metrics row
  /// with samples_per_s, wall_s and the phases' seconds per step filled. Starts the next interval.
  struct Interval {
    double samples_per_s = 0.0;
    double eta_s = 0.0;
    MetricsRow row;
  };
  Interval take_interval(std::int64_t step, std::int64_t total_steps);

  /// Seconds since the run began.
  double wall_seconds() const;

  /// \brief summary.json's fields of the run's books: samples_per_s (tokens_per_s where
  /// tokens_per_sample > 0), wall_s, comm (bytes per training step, summed over the ranks), the
  /// point-to-point exchange's under `neighbours` ("halo": a U-Net's; "context": a ring's; this
  /// rank's; null: none) and bubble_by_stage. Collective over world.
  void add_to_summary(nlohmann::json& j, const Config& cfg, const Communicator& comm, const char* neighbours,
                      std::int64_t tokens_per_sample) const;

 private:
  StepTimer timer_;
  double tensor_seconds_ = 0.0;
  double run_start_ = 0.0;
  double loop_start_ = 0.0;          // when the training loop began (the ETA's clock)
  std::int64_t loop_start_step_ = 0;  // the step it began at
  std::int64_t last_logged_step_ = 0;
  std::int64_t interval_samples_ = 0, samples_timed_ = 0;
  double step_seconds_ = 0.0, interval_step_seconds_ = 0.0;
  double pipeline_seconds_ = 0.0;  // Phase::pipeline of the intervals taken so far
  // Bytes handed to each group's communication during this run's training steps (by Group: total,
  // to other nodes), and the steps counted.
  std::array<std::array<double, 2>, 8> comm_bytes_{};
  std::int64_t comm_steps_ = 0;
  nn::HaloStats halo_;  // halo exchanges of this run's training steps (spatial models)
  std::int64_t halo_steps_ = 0;
};

}  // namespace tessera
