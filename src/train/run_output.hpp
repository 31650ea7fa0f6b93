#pragma once
// What a run writes into run.output_dir (DESIGN.md "Command line"): log.txt (what rank 0
// printed), metrics.csv (one row per logged step and per evaluation), the same rows in
// metrics.h5 (one dataset per column under /train and /eval, docs/analysis.md) and summary.json.
// Only rank 0 writes; every method is a no-op elsewhere, so callers need no rank checks.
#include <cstdint>
#include <fstream>
#include <memory>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

namespace tessera {

namespace io {
class MetricsFile;
}

/// One row of metrics.csv and metrics.h5.
struct MetricsRow {
  std::string kind;  ///< "train" or "eval"
  std::int64_t step = 0;
  std::int64_t epoch = 0;
  double loss = 0.0;
  std::optional<double> lr, grad_norm, samples_per_s, accuracy;
  std::optional<double> tokens_per_s;  ///< train rows of a token model (GPT): samples/s x context
  std::optional<double> rel_l2;  ///< eval rows of a field model: the mean relative L2 error
  double wall_s = 0.0;
  // Step-time split (train rows): seconds per step over the logging interval.
  std::optional<double> t_data, t_forward, t_backward, t_allreduce, t_optimizer, t_tensor, t_pipeline;
};

class RunOutput {
 public:
  /// \param writer true on the one rank that writes (world rank 0).
  /// \param resume_step when continuing a run: metrics.csv keeps its rows up to this step,
  ///        metrics.h5 is rebuilt from them, and log.txt is appended to; otherwise all three
  ///        start empty. A metrics.csv written before a column was added keeps its rows under
  ///        today's header, their cells moved by column name and the new columns empty;
  ///        InputError for a column this version does not know or a line that is not a row.
  RunOutput(bool writer, const std::string& dir, std::optional<std::int64_t> resume_step);
  ~RunOutput();

  /// Prints a line on stdout and appends it to log.txt.
  void log(const std::string& line);
  /// Appends a row to metrics.csv and metrics.h5 and flushes both.
  void metrics(const MetricsRow& row);
  /// Writes summary.json atomically (temporary file, then rename).
  void summary(const nlohmann::json& j);

 private:
  bool writer_;
  std::string dir_;
  std::ofstream log_, csv_;
  std::unique_ptr<io::MetricsFile> h5_;
};

/// \brief Seconds as "1h02m", "3m05s" or "42s" for ETA lines.
std::string format_duration(double seconds);

/// Where a run stands when it prints a progress line: steps, and wall-clock seconds of this
/// process's training loop (which began at step 0, or at the step a resumed run continues from).
struct Progress {
  std::int64_t step = 0;              ///< steps done
  std::int64_t total_steps = 0;
  std::int64_t last_logged_step = 0;  ///< the step of the previous line (the loop's start if none)
  std::int64_t loop_start_step = 0;   ///< the step the loop began at
  double interval_step_s = 0.0;       ///< seconds spent in training steps since the previous line
  double loop_s = 0.0;                ///< seconds since the loop began
  double loop_step_s = 0.0;           ///< the part of loop_s spent in training steps
};

/// \brief Seconds until the last step is done: the steps left times what a step costs now (the
/// mean of the steps since the previous line, so a slow first step leaves the estimate once the
/// next line comes) plus the seconds the loop spent between its steps (evaluations, checkpoints,
/// logging) per step it has done.
double eta_seconds(const Progress& p);

/// \brief A rate with three significant digits and no exponent ("0.0456", "3.14", "812", "15400"):
/// a progress line's samples/s and tokens/s, whatever the model's speed.
std::string format_rate(double per_second);

}  // namespace tessera
