#pragma once
// Data-parallel training of one deck: the step loop, evaluation, logging and checkpoints.
#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "comm/communicator.hpp"
#include "core/error.hpp"
#include "core/config.hpp"
#include "io/dataset.hpp"
#include "train/gradient_exchange.hpp"
#include "train/optimizer_step.hpp"
#include "train/run_report.hpp"
#include "train/checkpointer.hpp"
#include "train/loss_scaler.hpp"
#include "train/model.hpp"
#include "train/pipeline_executor.hpp"
#include "train/placement.hpp"
#include "train/run_output.hpp"
#include "train/sampler.hpp"
#include "train/step_timer.hpp"

namespace tessera {

/// --resume auto|none|PATH
struct ResumeRequest {
  enum class Mode { none, automatic, path } mode = Mode::none;
  std::string path;
  static ResumeRequest parse(const std::string& text);
};

/// Loss and accuracy over a whole split, reduced exactly (sums and counts).
struct EvalResult {
  double loss = 0.0;
  double accuracy = 0.0;
  double rel_l2 = 0.0;  ///< unet: the mean relative L2 error of the predicted fields; NaN otherwise
  std::int64_t samples = 0;
};

/// \brief The shape the dataset imposes on the model; throws InputError if loss and data disagree.
ModelShape model_shape(const Config& cfg, const io::SplitInfo& info);

/// \brief True where the deck evaluates on the test split (every epoch, every N steps or at the end).
/// \brief What of each sample this rank reads under parallel.spatial: its block of rows, or of a
/// sequence's positions (two chunks where context_head_tail).
io::RowBlock sample_block(const Config& cfg, const Communicator& comm);

bool eval_enabled(const EvalConfig& e);

/// \brief The most bytes a rank may cache of a split (data.cache): half its share of the node's
/// memory (mem::node_memory() over the ranks on the node).
std::uint64_t data_cache_limit(const Communicator& comm);

/// \brief Rows of the largest micro-batch a data rank trains on: the global batch split over the
/// data ranks and then over the micro-batches, rounded up.
int micro_batch_rows(const Config& cfg);

/// \brief The part of the model this rank holds under the deck's layout: its pipeline stage's
/// layers (its chunks of them under parallel.virtual_stages) and its tensor rank's blocks
/// (tensor sums through comm, their time added to *tensor_seconds when given).
ModelPart model_part(const Config& cfg, const Communicator& comm, const ModelShape& shape,
                     double* tensor_seconds = nullptr);

/// \brief Evaluates `model` on `split`, sharded over the data group and run through the
/// pipeline stages; collective over world.
EvalResult evaluate(const Config& cfg, const Communicator& comm, Model& model,
                    io::Split& split);

class Trainer {
 public:
  /// Opens the data, builds the model and optimizer, and restores a checkpoint if asked.
  /// Collective over world; every error is thrown on every rank.
  Trainer(const Config& cfg, const Communicator& comm, const ResumeRequest& resume);
  ~Trainer();

  /// \brief Trains to the end, or until a stop signal (SIGUSR1, SIGTERM) reaches any rank: then
  /// every rank stops after the same step, a checkpoint is written and signalled is returned.
  /// Writes metrics, checkpoints and summary.json. Collective.
  ExitCode run();

 private:
  std::string prepare_output_dir(const ResumeRequest& resume);
  /// One optimizer step: sample the batch, run the pipeline, finish the exchange and update,
  /// reduce the loss and the step's flags, decide. Returns the batch's mean loss.
  double train_step(double lr);
  /// The rest of the gradient exchange, the norm, clipping and the update (and ZeRO's
  /// allgather); the loss scale's decision.
  StepReport update(double lr, float loss_scale);
  /// One small reduction of the loss and the flags every rank must agree on (non-finite
  /// gradients, stop requests, the asynchronous save's progress); throws NumericError on a
  /// non-finite loss or gradient. Returns the batch's mean loss.
  double reduce_and_decide(double loss_sum, const StepReport& report, double batch_size);
  void log_progress(double lr, double loss, double grad_norm);
  /// Tokens in one sample of a token model (its context), 0 for the others: the progress lines'
  /// and summary.json's tokens/s.
  std::int64_t tokens_per_sample() const;
  /// The stats of the model's point-to-point exchange (a U-Net's halo, a transformer's ring), if any.
  std::optional<nn::HaloStats> neighbour_stats() const;
  EvalResult run_eval();
  void checkpoint();
  /// Completes the asynchronous save in flight, if any (waits for the writers). Collective.
  void finish_checkpoint();
  /// Every update still in flight (comm.priority's) applied before the parameters are read
  /// between steps; a non-finite one stops the run.
  void settle();
  [[noreturn]] void numerical_failure(std::int64_t step, double loss, double grad_norm);
  std::int64_t total_steps() const;
  ExitCode stop();
  void log_memory();
  nlohmann::json summary(const std::string& status) const;
  /// summary.json, by rank 0; a failure to write it reaches every rank. Collective.
  void write_summary(const std::string& status);

  const Config& cfg_;
  const Communicator& comm_;
  std::string resume_note_;  ///< why --resume auto took another checkpoint than `latest` names
  bool save_written_ = false;  ///< every rank's writer of the save in flight has finished
  double save_started_ = 0.0;  ///< when the save in flight was staged
  ExecSpace exec_;
  std::unique_ptr<io::Split> train_, test_;
  std::unique_ptr<Sampler> sampler_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<Sharding> sharding_;  // before the model: it plans the model's store
  std::unique_ptr<OptimizerStep> step_;         // owns the optimizer and its state
  std::unique_ptr<GradientExchange> exchange_;  // the model's layer hooks
  std::unique_ptr<PipelineExecutor> pipeline_;
  std::unique_ptr<Checkpointer> ckpt_;
  std::unique_ptr<RunOutput> out_;
  std::unique_ptr<LossScaler> scaler_;
  TrainState state_;
  std::vector<RankPlace> places_;  // where every rank runs (log.txt, summary.json)
  std::int64_t resumed_from_ = -1, last_checkpoint_step_ = -1, last_eval_step_ = -1;
  EvalResult last_eval_;
  double last_loss_ = 0.0, last_grad_norm_ = 0.0;
  bool stop_requested_ = false;

  // Per-micro-batch host staging and device buffers for one micro-batch.
  std::vector<float> h_inputs_, h_targets_;
  std::vector<std::int32_t> h_labels_;
  Matrix<float> inputs_, targets_;
  Vector<std::int32_t> labels_;

  RunReport report_;  // the run's books: timers, rates, bytes, the ETA's clocks
};

}  // namespace tessera
