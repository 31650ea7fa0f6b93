#include "train/trainer.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <memory>
#include <span>
#include <vector>

#include "comm/agree.hpp"
#include "core/deck.hpp"
#include "core/error.hpp"
#include "core/memory.hpp"
#include "core/version.hpp"
#include "blas/conv_library.hpp"
#include "blas/gemm.hpp"
#include "blas/gemm_library.hpp"
#include "optim/schedule.hpp"
#include "optim/state_file.hpp"
#include "train/field_norm.hpp"
#include "train/pipeline_executor.hpp"
#include "train/memory_estimate.hpp"
#include "train/replica_check.hpp"
#include "train/context_link.hpp"
#include "train/spatial_halo.hpp"
#include "train/stop_signal.hpp"
#include "train/threads.hpp"

namespace tessera {

namespace fs = std::filesystem;

namespace {

constexpr bool host_accessible = Kokkos::SpaceAccessibility<HostSpace, MemSpace>::accessible;
const char* run_files[] = {"summary.json", "metrics.csv", "log.txt"};
const char* flight_dir = "flight";  // flight records (comm/flight_record.hpp)

}  // namespace

io::RowBlock sample_block(const Config& cfg, const Communicator& comm) {
  return io::RowBlock{comm.sp(), comm.rank(Group::spatial), context_head_tail(cfg)};
}

bool eval_enabled(const EvalConfig& e) { return e.every_epoch || e.every_steps > 0 || e.at_end; }

std::uint64_t data_cache_limit(const Communicator& comm) {
  // Half of each rank's share of the node: the rest is for the model.
  const double share = mem::node_memory().bytes / 2 / comm.ranks_on_node();
  return share > 0 ? static_cast<std::uint64_t>(share) : io::kNoCacheLimit;
}

namespace {

// Reads `indices` of a split into device buffers; collective over the split's communicator.
// Host staging is skipped where device memory is host-accessible.
MicroBatch load_batch(io::Split& split, std::span<const std::int64_t> indices,
                 std::vector<float>& h_x, std::vector<std::int32_t>& h_y, std::vector<float>& h_t,
                 Matrix<float>& x, Vector<std::int32_t>& y, Matrix<float>& t) {
  const auto& info = split.info();
  const auto n = indices.size();
  const auto lw = static_cast<std::size_t>(info.label_width);
  float* px = host_accessible ? x.data() : h_x.data();
  std::int32_t* py = info.has_labels ? (host_accessible ? y.data() : h_y.data()) : nullptr;
  float* pt = info.has_labels ? nullptr : (host_accessible ? t.data() : h_t.data());
  split.read(indices, px, py, pt);
  if constexpr (!host_accessible) {
    const auto f = static_cast<std::size_t>(info.local_features);
    Kokkos::deep_copy(Kokkos::subview(x, std::make_pair<std::size_t>(0, n), Kokkos::ALL),
                      MatrixU<float, HostSpace>(h_x.data(), n, f));
    if (py) Kokkos::deep_copy(Kokkos::subview(y, std::make_pair<std::size_t>(0, n * lw)),
                              VectorU<std::int32_t, HostSpace>(h_y.data(), n * lw));
    if (pt) Kokkos::deep_copy(Kokkos::subview(t, std::make_pair<std::size_t>(0, n), Kokkos::ALL),
                              MatrixU<float, HostSpace>(h_t.data(), n, t.extent(1)));
  }
  MicroBatch b;
  b.x = MatrixU<const float>(x.data(), n, x.extent(1));
  if (info.has_labels) b.labels = VectorU<const std::int32_t>(y.data(), n * lw);
  else b.targets = MatrixU<const float>(t.data(), n, t.extent(1));
  return b;
}

void allocate_batch(const io::SplitInfo& info, std::size_t rows, std::vector<float>& h_x,
                    std::vector<std::int32_t>& h_y, std::vector<float>& h_t, Matrix<float>& x,
                    Vector<std::int32_t>& y, Matrix<float>& t) {
  const auto f = static_cast<std::size_t>(info.local_features);
  const auto w = static_cast<std::size_t>(std::max<std::int64_t>(1, info.local_target_width));
  const auto lw = static_cast<std::size_t>(info.label_width);
  x = Matrix<float>(mem::label(mem::Category::data, "tessera::Trainer::inputs"), rows, f);
  y = Vector<std::int32_t>(mem::label(mem::Category::data, "tessera::Trainer::labels"), info.has_labels ? rows * lw : 0);
  t = Matrix<float>(mem::label(mem::Category::data, "tessera::Trainer::targets"), info.has_labels ? 0 : rows, w);
  if (!host_accessible) {
    h_x.resize(rows * f);
    h_y.resize(info.has_labels ? rows * lw : 0);
    h_t.resize(info.has_labels ? 0 : rows * w);
  }
}

}  // namespace

ResumeRequest ResumeRequest::parse(const std::string& text) {
  ResumeRequest r;
  if (text.empty() || text == "none") r.mode = Mode::none;
  else if (text == "auto") r.mode = Mode::automatic;
  else { r.mode = Mode::path; r.path = text; }
  return r;
}

ModelShape model_shape(const Config& cfg, const io::SplitInfo& info) {
  ModelShape s;
  s.in_features = info.features;
  s.sample_shape = info.sample_shape;
  s.target_shape = info.target_shape;
  s.classification = info.has_labels;
  s.outputs = info.has_labels ? info.classes : info.target_width;
  const bool tokens = info.label_width > 1 || (info.has_labels && info.label_width == info.features &&
                                               info.sample_shape.size() == 1 && is_transformer(cfg.model.kind));
  if (is_transformer(cfg.model.kind) && !tokens)
    throw InputError(fmt::format("model.kind = \"{}\" needs a language dataset ({} /{} has no tokens; "
                                 "write one with `tessera prepare text`)", to_string(cfg.model.kind), info.file,
                                 info.split));
  if (!is_transformer(cfg.model.kind) && info.label_width > 1)
    throw InputError(fmt::format("{} /{} holds tokens (a language dataset); model.kind = \"{}\" needs "
                                 "inputs with labels or targets (use model.kind = \"gpt\")",
                                 info.file, info.split, to_string(cfg.model.kind)));
  if (cfg.model.loss == LossKind::cross_entropy && !info.has_labels)
    throw InputError(fmt::format("model.loss = \"cross_entropy\" needs integer labels, but {} "
                                 "/{} holds float targets; use model.loss = \"mse\" or \"auto\"",
                                 info.file, info.split));
  if (cfg.model.loss == LossKind::mse && info.has_labels)
    throw InputError(fmt::format("model.loss = \"mse\" needs float targets, but {} /{} holds "
                                 "class labels; use model.loss = \"cross_entropy\" or \"auto\"",
                                 info.file, info.split));
  check_model_size(cfg, s);
  return s;
}

int micro_batch_rows(const Config& cfg) {
  // In 64 bits: global_batch may be INT_MAX (a deck limit), the sum below would overflow an int.
  const std::int64_t parts = std::int64_t{cfg.parallel.data} * cfg.parallel.micro_batches;
  return static_cast<int>((std::int64_t{cfg.train.global_batch} + parts - 1) / parts);
}

ModelPart model_part(const Config& cfg, const Communicator& comm, const ModelShape& shape,
                     double* tensor_seconds) {
  ModelPart part;
  part.chunks = stage_chunks(cfg, stage_bounds(cfg, shape), comm.coord().pipeline);
  part.tp = comm.tp();
  part.t = comm.coord().tensor;
  part.tensor_sum = [&comm, tensor_seconds](float* x, std::size_t n) {
    const double t0 = StepTimer::now();
    comm.allreduce_sum(x, n, Group::tensor);
    if (tensor_seconds) *tensor_seconds += StepTimer::now() - t0;
  };
  if (cfg.model.kind == ModelKind::unet && comm.sp() > 1) part.halo = std::make_shared<SpatialHalo<float>>(comm);
  if (is_transformer(cfg.model.kind) && comm.sp() > 1) {  // context parallelism (nn/context_parallel.cpp)
    part.sp = comm.sp();
    part.s = comm.rank(Group::spatial);
    part.all_to_all = [&comm](const float* send, float* recv, std::size_t per_rank) {
      comm.all_to_all(send, recv, per_rank, Group::spatial);
    };
    part.spatial_sum = [&comm](double* x, std::size_t n) { comm.allreduce_sum(x, n, Group::spatial); };
    if (cfg.parallel.context_comm == ContextComm::ring) {  // nn/context_ring.cpp
      part.ring = true;
      part.context = std::make_shared<ContextLink>(comm);
      part.messages = [link = part.context.get()](std::span<const nn::ContextMessage<float>> messages) {
        link->start(messages);
      };
      part.wait = [link = part.context.get()] { link->wait(); };
    }
  }
  part.halo_overlap = cfg.parallel.halo_overlap;
  return part;
}

EvalResult evaluate(const Config& cfg, const Communicator& comm, Model& model,
                    io::Split& split) {
  ScopedRegion region("tessera::evaluate");
  const ExecSpace exec;
  const auto& info = split.info();
  const int dp = comm.size(Group::data), r = comm.rank(Group::data);
  // Contiguous shard of the split per data rank; every rank makes the same number of reads.
  std::vector<std::int64_t> all(static_cast<std::size_t>(info.samples));
  for (std::size_t i = 0; i < all.size(); ++i) all[i] = static_cast<std::int64_t>(i);
  const auto mine = Sampler::part(all, r, dp);
  const std::size_t largest = (all.size() + static_cast<std::size_t>(dp) - 1) / static_cast<std::size_t>(dp);
  const auto batch = static_cast<std::size_t>(batch_rows(cfg, 1, info.samples).eval);
  const std::size_t rounds = (largest + batch - 1) / batch;

  std::vector<float> h_x, h_t;
  std::vector<std::int32_t> h_y;
  Matrix<float> x, t;
  Vector<std::int32_t> y;
  allocate_batch(info, batch, h_x, h_y, h_t, x, y, t);
  double sums[4] = {0.0, 0.0, 0.0, 0.0};  // loss, correct, samples, relative L2 errors
  // Every data rank runs the same number of rounds through the stages, one micro-batch each.
  MicroBatches work;
  work.count = static_cast<int>(rounds);
  work.samples = [&](int k) {
    const std::size_t begin = std::min(static_cast<std::size_t>(k) * batch, mine.size());
    return mine.subspan(begin, std::min(batch, mine.size() - begin));
  };
  work.read = [&](std::span<const std::int64_t> idx) { return load_batch(split, idx, h_x, h_y, h_t, x, y, t); };
  work.loss = [&](int slot, int rows, const MicroBatch& b) {
    const LossSums l = model.loss(exec, slot, b.labels, b.targets, 0.0f);
    sums[0] += l.loss;
    sums[1] += l.correct;
    sums[2] += static_cast<double>(rows);
    sums[3] += l.rel_l2;
  };
  StepTimer timer;  // evaluation's phases belong to no step
  PipelineExecutor(cfg, comm, model, timer).forward_only(exec, work);
  // The last stage's tensor rank 0 (and spatial rank 0) of each data rank holds the sums.
  if (!model.last_stage() || comm.rank(Group::tensor) != 0 || comm.rank(Group::spatial) != 0)
    sums[0] = sums[1] = sums[2] = sums[3] = 0.0;
  comm.allreduce_sum(sums, 4, Group::world);
  EvalResult e;
  e.samples = static_cast<std::int64_t>(sums[2]);
  e.loss = sums[0] / sums[2];
  e.accuracy = info.has_labels ? sums[1] / sums[2] : std::nan("");
  e.rel_l2 = cfg.model.kind == ModelKind::unet ? sums[3] / sums[2] : std::nan("");
  return e;
}

Trainer::Trainer(const Config& cfg, const Communicator& comm, const ResumeRequest& resume)
    : cfg_(cfg), comm_(comm) {
  // Where every rank runs, before anything is allocated: a tensor group across nodes may be an error.
  const ThreadSetup threads = current_thread_setup();
  places_ = gather_placement(comm_, comm_.dp(), comm_.tp(), threads.blas.threads, threads.host_threads, comm_.sp());
  check_tensor_within_node(cfg_, places_);
  ckpt_ = std::make_unique<Checkpointer>(cfg_, comm_);
  const std::string resume_path = prepare_output_dir(resume);

  // Data first: the model's shape comes from it. Under parallel.spatial each rank reads its block
  // of every sample's rows.
  const MPI_Comm data_comm = comm_.handle(Group::data);
  const std::uint64_t cache_limit = data_cache_limit(comm_);
  const io::RowBlock block = sample_block(cfg_, comm_);
  {
    const auto watch = comm_.watch("dataset open", Group::data);
    train_ = io::open_split(data_comm, cfg_.data.path, cfg_.data.train_split, cfg_.model.context,
                            cfg_.data.cache, cache_limit, block);
  }
  ModelShape shape = model_shape(cfg_, train_->info());
  std::string norm_note;  // which statistics standardise the fields (resumed: the checkpoint's)
  if (normalizes_fields(cfg_)) {
    const nn::UNetShape u = unet_shape(cfg_, shape);
    shape.norm = choose_field_norm(cfg_, comm_, resume_path, u.in_channels, u.out_channels,
                                   [&]() -> io::Split& { return *train_; }, &norm_note);
  }
  if (eval_enabled(cfg_.eval)) {
    const auto watch = comm_.watch("dataset open", Group::data);
    test_ = io::open_split(data_comm, cfg_.data.path, cfg_.data.test_split, cfg_.model.context,
                           cfg_.data.cache, cache_limit, block);
    const auto& ti = test_->info();
    if (ti.features != shape.in_features || ti.has_labels != shape.classification ||
        (ti.has_labels ? ti.classes > shape.outputs : ti.target_width != shape.outputs) ||
        (cfg_.model.kind == ModelKind::unet && (ti.sample_shape != shape.sample_shape ||
                                                ti.target_shape != shape.target_shape)))
      throw InputError(fmt::format("{}: split /{} does not match /{} (features {} vs {}, outputs "
                                   "{} vs {})", cfg_.data.path, cfg_.data.test_split,
                                   cfg_.data.train_split, ti.features, shape.in_features,
                                   ti.has_labels ? ti.classes : ti.target_width, shape.outputs));
  }

  // Buffers as large as the data need, and no run the node cannot hold.
  const BatchRows rows = batch_rows(cfg_, train_->info().samples, test_ ? test_->info().samples : 0);
  check_memory(cfg_, estimate_memory(cfg_, shape, rows), comm_.ranks_on_node(),
               [&](const Config& c) { return estimate_memory(c, shape, rows); });
  const auto micro = static_cast<int>(rows.micro);
  // The sharding first: it says how the model's parameter store is planned and allocated.
  sharding_ = std::make_unique<Sharding>(cfg_, comm_);
  model_ = std::make_unique<Model>(cfg_, shape, static_cast<int>(std::max(rows.micro, rows.eval)),
                                   sharding_->layout(), model_part(cfg_, comm_, shape, report_.tensor_seconds()));
  agree(comm_.handle(), [&] { sharding_->bind(model_->params()); });  // optimizer.offload_values: its file
  if (sharding_->values_sharded()) sharding_->initialize(exec_, cfg_.run.seed);
  // The optimizer's state (optimizer.offload = "disk": its scratch file, made here) on every rank or none.
  agree(comm_.handle(), [&] { step_ = std::make_unique<OptimizerStep>(cfg_, comm_, model_->params(), *sharding_); });
  exchange_ = GradientExchange::make(cfg_, comm_, model_->params(), *sharding_, *step_);
  model_->set_hooks(exchange_.get());
  pipeline_ = std::make_unique<PipelineExecutor>(cfg_, comm_, *model_, report_.timer(), report_.tensor_seconds());
  sampler_ = std::make_unique<Sampler>(train_->info().samples, cfg_.run.seed,
                                       cfg_.train.global_batch, cfg_.train.drop_last);
  if (sampler_->batches_per_epoch() == 0)
    throw InputError(fmt::format("train.global_batch = {} is larger than the {} samples of {} /{}",
                                 cfg_.train.global_batch, sampler_->samples(), cfg_.data.path,
                                 cfg_.data.train_split));
  allocate_batch(train_->info(), static_cast<std::size_t>(micro), h_inputs_, h_labels_, h_targets_,
                 inputs_, labels_, targets_);

  scaler_ = std::make_unique<LossScaler>(cfg_.train.precision, cfg_.train.loss_scale,
                                         cfg_.train.loss_scale_window);
  if (!resume_path.empty()) {
    const auto watch = comm_.watch("checkpoint read", Group::world);
    state_ = ckpt_->load(resume_path, *model_, *sharding_, step_->optimizer());
    if (state_.batch_in_epoch >= sampler_->batches_per_epoch())
      throw InputError(fmt::format("{}: checkpoint attribute /train/batch_in_epoch is {}, but an epoch "
                                   "of {} /{} at train.global_batch = {} has {} batches (0 to {})",
                                   resume_path, state_.batch_in_epoch, cfg_.data.path,
                                   cfg_.data.train_split, cfg_.train.global_batch,
                                   sampler_->batches_per_epoch(), sampler_->batches_per_epoch() - 1));
    resumed_from_ = last_checkpoint_step_ = state_.step;
    if (scaler_->enabled())
      scaler_->set_state({state_.loss_scale, state_.loss_scale_good_steps, state_.skipped_steps});
  }
  // Every checkpoint path the run will write can be written: a run that could not save fails here,
  // not at its first save. Nothing of the run directory changes before here; rank 0's files, agreed.
  ckpt_->check_writable(resumed_from_ >= 0 ? state_.step : 0);
  agree(comm_.handle(), [&] {
    out_ = std::make_unique<RunOutput>(comm_.is_root(), cfg_.run.output_dir,
                                       resumed_from_ >= 0 ? std::optional(state_.step) : std::nullopt);
  });
  if (!resume_note_.empty()) out_->log("resume: " + resume_note_);
  for (const std::string& warning : cfg_.warnings) out_->log("warning: " + warning);

  const auto& store = model_->params();
  out_->log(fmt::format("tessera {}: {} on {} ranks ({}), data {} ({} train samples)",
                        TESSERA_VERSION, cfg_.deck_path, comm_.size(),
                        comm_.layout(cfg_.parallel.zero), cfg_.data.path, sampler_->samples()));
  std::size_t parameters = 0;
  for (const auto& p : logical_params(cfg_, shape)) parameters += p.size;
  out_->log(fmt::format("model: {} ({} parameters; {} on this rank), {} steps/epoch, {} steps in all",
                        describe_model(cfg_, shape), parameters, store.parameter_count(),
                        sampler_->batches_per_epoch(), total_steps()));
  if (!norm_note.empty()) out_->log(norm_note);
  if (cfg_.checkpoint.async)
    out_->log("checkpoints: asynchronous (each rank copies its part at the step, a thread of its own "
              "writes it; latest moves once every rank's part is on disk)");
  if (cfg_.train.check_replicas_every > 0)
    out_->log(*replicated_state(*sharding_, comm_) == '\0'
                  ? fmt::format("replica checks: none (train.check_replicas_every = {}: {})",
                                cfg_.train.check_replicas_every,
                                comm_.size(Group::replica) == 1 ? "one data replica" : "ZeRO 3 shards everything")
                  : fmt::format("replica checks: every {} steps the data replicas compare the checksums of "
                                "their {}", cfg_.train.check_replicas_every, replicated_state(*sharding_, comm_)));
  out_->log(fmt::format("exchange: {} bucket(s) of about {} MB, overlap {}, no_sync {}, {}",
                        store.buckets().size(), cfg_.comm.bucket_mb, cfg_.comm.overlap,
                        cfg_.comm.no_sync, sharding_->describe()));
  if (cfg_.optimizer.offload != OptimizerOffload::none)
    out_->log("optimizer state (rank 0): " + step_->optimizer().describe_offload());
  if (sharding_->value_file() != nullptr) out_->log("parameter values (rank 0): " + sharding_->describe_values());
  out_->log(comm_.describe_backend());
  out_->log(describe(threads));
  for (const auto& line : describe_placement(places_, comm_.dp(), comm_.tp(), comm_.pp(), comm_.sp())) out_->log(line);
  for (const auto& line : placement_warnings(places_, comm_.dp(), comm_.tp(), comm_.pp(), comm_.sp())) out_->log(line);
  out_->log(blas::describe_gemm());
  if (cfg_.model.kind == ModelKind::cnn || cfg_.model.kind == ModelKind::unet) out_->log(blas::describe_conv(cfg_.run.conv, cfg_.train.precision));
  if (cfg_.train.precision != Precision::fp32)
    out_->log(fmt::format("precision: {} matrix products ({}), outputs stored in {}; master weights, "
                          "optimizer and reductions fp32{}", precision_name(cfg_.train.precision),
                          blas::lowp_path(cfg_.train.precision), precision_name(cfg_.train.precision),
                          scaler_->enabled() ? fmt::format("; dynamic loss scale from {}, doubled after {} "
                                                           "finite steps", scaler_->scale(), scaler_->window())
                                             : std::string()));
  if (resumed_from_ >= 0)
    out_->log(fmt::format("resumed from {} at step {} (epoch {}, batch {})", resume_path,
                          state_.step, state_.epoch, state_.batch_in_epoch));
}

Trainer::~Trainer() = default;

std::int64_t Trainer::total_steps() const {
  return cfg_.train.steps > 0 ? cfg_.train.steps
                              : static_cast<std::int64_t>(cfg_.train.epochs) * sampler_->batches_per_epoch();
}

std::string Trainer::prepare_output_dir(const ResumeRequest& resume) {
  const LatestCheckpoint latest = resume.mode == ResumeRequest::Mode::automatic ? ckpt_->find_latest()
                                                                                : LatestCheckpoint{};
  resume_note_ = latest.note;
  std::string resume_path;
  if (resume.mode == ResumeRequest::Mode::path) resume_path = resume.path;
  if (resume.mode == ResumeRequest::Mode::automatic) resume_path = latest.path;
  agree(comm_.handle(), [&] {
    if (!comm_.is_root()) return;
    const fs::path dir(cfg_.run.output_dir);
    std::error_code ec;
    std::string found;
    for (const char* f : run_files)
      if (fs::exists(dir / f, ec) && found.empty()) found = (dir / f).string();
    // Checkpoints are what a run can least afford to lose: a fresh run never deletes one unless
    // told to (run.overwrite).
    std::size_t checkpoints = 0;
    for (fs::directory_iterator it(dir / "checkpoints", ec), end; !ec && it != end; it.increment(ec))
      if (it->path().extension() == ".h5" && it->path().filename().string().starts_with("step_")) {
        ++checkpoints;
        if (found.empty()) found = it->path().string();
      }
    const bool continuing = !resume_path.empty();
    const bool finished = fs::exists(dir / "summary.json", ec);
    if (!found.empty() && !continuing && !cfg_.run.overwrite &&
        (resume.mode == ResumeRequest::Mode::none || finished || checkpoints > 0))
      throw InputError(fmt::format("run.output_dir '{}' already holds a run ({}); continue it "
                                   "with --resume auto, or replace it with --set run.overwrite=true",
                                   cfg_.run.output_dir, found));
    if (!continuing) {
      // A fresh run: clear what an earlier run left (without a checkpoint, or run.overwrite) so
      // `latest` cannot point into it.
      for (const char* f : run_files) fs::remove(dir / f, ec);
      fs::remove_all(dir / "checkpoints", ec);
      fs::remove_all(dir / flight_dir, ec);
    }
    fs::create_directories(dir, ec);
    if (ec)
      throw InputError(fmt::format("run.output_dir '{}': cannot create it: {}", dir.string(), ec.message()));
  });
  return resume_path;
}

double Trainer::train_step(double lr) {
  // Sample the batch: this data rank's part of it, in micro-batches.
  const auto batch = sampler_->global_batch(state_.epoch, state_.batch_in_epoch);
  const auto local = Sampler::part(batch, comm_.rank(Group::data), comm_.size(Group::data));
  // fp16: the loss gradient carries the loss scale; finish_step divides it out again.
  const float loss_scale = scaler_->scale();
  const float scale = loss_scale / static_cast<float>(batch.size());
  double loss_sum = 0.0;
  MicroBatches micro;
  micro.count = cfg_.parallel.micro_batches;
  micro.samples = [&](int m) { return Sampler::part(local, m, micro.count); };
  micro.read = [&](std::span<const std::int64_t> idx) {
    return load_batch(*train_, idx, h_inputs_, h_labels_, h_targets_, inputs_, labels_, targets_);
  };
  micro.loss = [&](int slot, int /*rows*/, const MicroBatch& b) {
    loss_sum += model_->loss(exec_, slot, b.labels, b.targets, scale).loss;
  };

  // Run the pipeline: the stage's forwards and backwards in the schedule's order; each full
  // gradient bucket's exchange starts from the backward hooks (GradientExchange).
  exchange_->begin_step(exec_);
  *report_.tensor_seconds() = 0.0;
  pipeline_->train(exec_, *exchange_, micro);

  // Finish the exchange and update; reduce the loss and the flags, and decide.
  const StepReport report = update(lr, loss_scale);
  return reduce_and_decide(loss_sum, report, static_cast<double>(batch.size()));
}

StepReport Trainer::update(double lr, float loss_scale) {
  // The rest of the exchange, norm, clipping, the update (and ZeRO's allgather).
  const StepReport report = exchange_->finish_step(exec_, lr, loss_scale, scaler_->enabled());
  // The norm is reduced over every group, so every rank takes the same decision.
  scaler_->update(!report.skipped);
  const LossScaler::State ss = scaler_->state();
  state_.loss_scale = ss.scale;
  state_.loss_scale_good_steps = ss.good_steps;
  state_.skipped_steps = ss.skipped;
  if (report.skipped)
    out_->log(fmt::format("step {}: fp16 overflow in the gradients (scale {}): update skipped, loss scale now {}",
                          state_.step + 1, loss_scale, scaler_->scale()));
  report_.timer().add(Phase::allreduce, report.comm_s);
  report_.timer().add(Phase::optimizer, report.update_s);
  if (state_.step < 3)
    if (const std::string line = exchange_->take_report(); !line.empty())
      out_->log(fmt::format("step {}: {}", state_.step + 1, line));
  return report;
}

double Trainer::reduce_and_decide(double loss_sum, const StepReport& report, double batch_size) {
  const double grad_norm = report.grad_norm;
  // The loss lives on the last stage; its tensor ranks all hold it: count it once (a spatial
  // model counts it on spatial rank 0).
  if (!model_->last_stage() || comm_.rank(Group::tensor) != 0 || comm_.rank(Group::spatial) != 0) loss_sum = 0.0;
  // One small reduction per step: the loss, whether any rank saw a non-finite gradient, whether
  // any rank was asked to stop (so all stop after this same step), and how many ranks have
  // finished writing the asynchronous checkpoint in flight (all: it is completed after the step).
  double reduced[4] = {loss_sum, std::isfinite(grad_norm) ? 0.0 : 1.0, stop_signal() ? 1.0 : 0.0,
                       ckpt_->save_written() ? 1.0 : 0.0};
  comm_.allreduce_sum(reduced, 4, Group::world);
  stop_requested_ = reduced[2] > 0.0;
  save_written_ = reduced[3] == static_cast<double>(comm_.size());
  const double loss = reduced[0] / batch_size;
  last_grad_norm_ = grad_norm;
  if (!report.skipped && (reduced[1] > 0.0 || !std::isfinite(loss))) numerical_failure(state_.step + 1, loss, grad_norm);
  return loss;
}

void Trainer::numerical_failure(std::int64_t step, double loss, double grad_norm) {
  finish_checkpoint();  // the one in flight is of an earlier, good step
  const std::string latest = last_checkpoint_step_ >= 0 ? fmt::format("step {}", last_checkpoint_step_) : "none";
  write_summary("numerical_failure");
  throw NumericError(fmt::format(
      "non-finite loss or gradient at step {} (loss {}, gradient norm {}); the run stopped "
      "before saving anything of this step, and the newest checkpoint ({}) is intact. "
      "---> HINT: lower optimizer.lr or set optimizer.clip_grad_norm",
      step, loss, grad_norm, latest));
}

// An exchange may leave updates in flight after a step (comm.priority applies each bucket as its
// pieces arrive, at the latest in the next forward); whatever reads the parameters between steps
// first has them all in, and the run stops as after a step where a bucket's gradient was
// non-finite: that bucket never reached them.
void Trainer::settle() {
  const std::optional<double> norm = exchange_->flush();
  if (!norm) return;
  last_grad_norm_ = *norm;
  if (!std::isfinite(last_grad_norm_)) numerical_failure(state_.step, last_loss_, last_grad_norm_);
}

std::optional<nn::HaloStats> Trainer::neighbour_stats() const {
  if (const auto* halo = model_->halo()) return halo->stats();
  if (const auto* link = model_->context()) return link->stats();
  return std::nullopt;
}

std::int64_t Trainer::tokens_per_sample() const {
  return is_transformer(cfg_.model.kind) ? cfg_.model.context : 0;
}

void Trainer::log_progress(double lr, double loss, double grad_norm) {
  RunReport::Interval interval = report_.take_interval(state_.step, total_steps());
  const double rate = interval.samples_per_s;
  const double epoch = static_cast<double>(state_.epoch) +
                       static_cast<double>(state_.batch_in_epoch) / static_cast<double>(sampler_->batches_per_epoch());
  // One plain line per log, never a carriage return: log.txt and batch job output stay readable.
  const double percent = 100.0 * static_cast<double>(state_.step) / static_cast<double>(total_steps());
  // Rates in the model's units, three significant digits: tokens/s beside samples/s for token
  // models (a sample is a context of tokens).
  const std::string tokens = tokens_per_sample() > 0
                                 ? " tokens/s " + format_rate(rate * static_cast<double>(tokens_per_sample()))
                                 : std::string();
  out_->log(fmt::format("step {:>{}}/{} ({:.1f}%) epoch {:.2f} loss {:.4f} lr {:.4g} grad_norm {:.4f} "
                        "samples/s {}{} eta {}",
                        state_.step, fmt::formatted_size("{}", total_steps()), total_steps(), percent,
                        epoch, loss, lr, grad_norm, format_rate(rate), tokens, format_duration(interval.eta_s)));
  MetricsRow& row = interval.row;
  row.kind = "train";
  row.step = state_.step;
  row.epoch = state_.epoch;
  row.loss = loss;
  row.lr = lr;
  row.grad_norm = grad_norm;
  if (tokens_per_sample() > 0) row.tokens_per_s = rate * static_cast<double>(tokens_per_sample());
  out_->metrics(row);
}

EvalResult Trainer::run_eval() {
  settle();
  last_eval_ = evaluate(cfg_, comm_, *model_, *test_);
  last_eval_step_ = state_.step;
  out_->log(fmt::format("eval  step {} epoch {}: test loss {:.4f}{}{} ({} samples)", state_.step,
                        state_.epoch, last_eval_.loss,
                        std::isnan(last_eval_.accuracy) ? std::string()
                                                        : fmt::format(" accuracy {:.4f}", last_eval_.accuracy),
                        std::isnan(last_eval_.rel_l2) ? std::string()
                                                      : fmt::format(" relative L2 error {:.4f}", last_eval_.rel_l2),
                        last_eval_.samples));
  MetricsRow row;
  row.kind = "eval";
  row.step = state_.step;
  row.epoch = state_.epoch;
  row.loss = last_eval_.loss;
  if (!std::isnan(last_eval_.accuracy)) row.accuracy = last_eval_.accuracy;
  if (!std::isnan(last_eval_.rel_l2)) row.rel_l2 = last_eval_.rel_l2;
  row.wall_s = report_.wall_seconds();
  out_->metrics(row);
  return last_eval_;
}

void Trainer::checkpoint() {
  settle();
  const double t0 = StepTimer::now();
  const auto watch = comm_.watch("checkpoint write", Group::world);
  if (!cfg_.checkpoint.async) {
    const std::string path = ckpt_->save(*model_, *sharding_, step_->optimizer(), state_);
    last_checkpoint_step_ = state_.step;
    out_->log(fmt::format("checkpoint {} ({:.2f} s)", path, StepTimer::now() - t0));
    return;
  }
  // At most one save in flight: the next waits for the last.
  finish_checkpoint();
  ckpt_->begin_save(*model_, *sharding_, step_->optimizer(), state_);
  last_checkpoint_step_ = state_.step;
  save_started_ = StepTimer::now();
  out_->log(fmt::format("checkpoint of step {}: staged in {:.3f} s, writing in the background",
                        state_.step, save_started_ - t0));
}

void Trainer::finish_checkpoint() {
  if (!ckpt_->save_in_flight()) return;
  const double t0 = StepTimer::now();
  const auto watch = comm_.watch("checkpoint write", Group::world);
  const std::string path = ckpt_->finish_save();
  save_written_ = false;
  out_->log(fmt::format("checkpoint {} (written in the background in {:.2f} s; waited {:.3f} s)", path,
                        StepTimer::now() - save_started_, StepTimer::now() - t0));
}

ExitCode Trainer::run() {
  const std::int64_t total = total_steps();
  const std::int64_t bpe = sampler_->batches_per_epoch();
  report_.begin_loop(state_.step);
  while (state_.step < total) {
    const double lr = learning_rate(cfg_.schedule, cfg_.optimizer.lr, state_.step, total);
    const auto batch_size = static_cast<std::int64_t>(
        sampler_->global_batch(state_.epoch, state_.batch_in_epoch).size());
    const RunReport::StepMark mark = report_.begin_step(comm_, neighbour_stats());
    last_loss_ = train_step(lr);
    report_.end_step(mark, comm_, neighbour_stats(), batch_size);

    ++state_.step;
    state_.samples_seen += batch_size;
    if (state_.step == resumed_from_ + 1 || (resumed_from_ < 0 && state_.step == 1)) {
      log_memory();
      check_memory_limit(cfg_, comm_);
    }
    bool epoch_end = false;
    if (++state_.batch_in_epoch == bpe) {
      ++state_.epoch;
      state_.batch_in_epoch = 0;
      epoch_end = true;
    }
    if (state_.step % cfg_.train.log_every == 0 || state_.step == total)
      log_progress(lr, last_loss_, last_grad_norm_);
    if (test_ && ((epoch_end && cfg_.eval.every_epoch) ||
                  (cfg_.eval.every_steps > 0 && state_.step % cfg_.eval.every_steps == 0)))
      run_eval();
    if (cfg_.train.check_replicas_every > 0 && state_.step % cfg_.train.check_replicas_every == 0) {
      settle();
      check_replicas(cfg_, comm_, *model_, *sharding_, step_->optimizer(), state_.step);
    }
    // An asynchronous save whose every part is written (the step's reduction said so) is
    // completed here, between steps.
    if (save_written_) finish_checkpoint();
    if (cfg_.checkpoint.every_steps > 0 && state_.step % cfg_.checkpoint.every_steps == 0)
      checkpoint();
    if (stop_requested_) return stop();
  }
  settle();
  if (test_ && cfg_.eval.at_end && last_eval_step_ != state_.step) run_eval();
  if (cfg_.checkpoint.at_end && last_checkpoint_step_ != state_.step) checkpoint();
  finish_checkpoint();

  const double wall = report_.wall_seconds();
  write_summary("completed");
  out_->log(fmt::format("done: {} steps in {}, final train loss {:.4f}{}", state_.step,
                        format_duration(wall), last_loss_,
                        last_eval_step_ >= 0 ? fmt::format(", test loss {:.4f} accuracy {:.4f}",
                                                           last_eval_.loss, last_eval_.accuracy)
                                             : std::string()));
  return ExitCode::ok;
}

void Trainer::write_summary(const std::string& status) {
  const nlohmann::json j = summary(status);  // collective
  agree(comm_.handle(), [&] { out_->summary(j); });
}

nlohmann::json Trainer::summary(const std::string& status) const {
  nlohmann::json j;
  j["status"] = status;
  j["steps"] = state_.step;
  j["epochs"] = static_cast<double>(state_.samples_seen) / static_cast<double>(sampler_->samples());
  j["final_train_loss"] = last_loss_;
  j["test_loss"] = last_eval_step_ >= 0 ? nlohmann::json(last_eval_.loss) : nlohmann::json(nullptr);
  j["test_accuracy"] = last_eval_step_ >= 0 && !std::isnan(last_eval_.accuracy)
                           ? nlohmann::json(last_eval_.accuracy) : nlohmann::json(nullptr);
  if (cfg_.model.kind == ModelKind::unet)
    j["test_rel_l2"] = last_eval_step_ >= 0 ? nlohmann::json(last_eval_.rel_l2) : nlohmann::json(nullptr);
  report_.add_to_summary(j, cfg_, comm_, model_->halo() != nullptr ? "halo" : model_->context() != nullptr ? "context" : nullptr,
                         tokens_per_sample());  // collective
  j["layout"] = comm_.layout(cfg_.parallel.zero);
  if (cfg_.optimizer.offload != OptimizerOffload::none) {
    // Bytes this rank moved to and from its offload files (updates, gathers, checkpoints, resume),
    // the updates' and the gathers' shares per step and the updates' rate; all ranks summed
    // (collective).
    const Optimizer& opt = step_->optimizer();
    const StateFile* file = opt.offload_file();
    const StateFile* values = sharding_->value_file();
    const Optimizer::Traffic& t = opt.traffic();
    double sums[7] = {(file ? file->bytes_read() : 0.0) + (values ? values->bytes_read() : 0.0),
                      (file ? file->bytes_written() : 0.0) + (values ? values->bytes_written() : 0.0),
                      t.read, t.written, t.seconds, static_cast<double>(t.steps), sharding_->value_bytes_read()};
    comm_.allreduce_sum(sums, 7, Group::world);
    nlohmann::json o = {{"kind", std::string(to_string(cfg_.optimizer.offload))},
                        {"staged", offload_staged(cfg_.optimizer)},
                        {"values_on_disk", values != nullptr},
                        {"bytes_read", sums[0]},
                        {"bytes_written", sums[1]}};
    if (file) o["direct_io_rank0"] = file->direct();
    const double steps = sums[5] / comm_.size();  // each rank counts every step it updated
    o["update_bytes_read_per_step"] = steps > 0 ? nlohmann::json(sums[2] / steps) : nlohmann::json(nullptr);
    o["update_bytes_written_per_step"] = steps > 0 ? nlohmann::json(sums[3] / steps) : nlohmann::json(nullptr);
    // The values' reads before each gather (forward and backward).
    o["gather_bytes_read_per_step"] = steps > 0 ? nlohmann::json(sums[6] / steps) : nlohmann::json(nullptr);
    // Per rank: its bytes over its seconds in the updates' tile loops (I/O waits included).
    o["update_gb_per_s_per_rank"] = sums[4] > 0 ? nlohmann::json((sums[2] + sums[3]) / sums[4] / 1e9) : nlohmann::json(nullptr);
    j["optimizer_offload"] = o;
  }
  if (sharding_->values_sharded()) {
    // ZeRO 3's gathers on the most waiting rank: how many, how many were gathered ahead of their
    // use (parallel.zero_prefetch) or dropped unused, and the seconds spent waiting in them.
    const Sharding::GatherCounts g = sharding_->gather_counts();
    double most[4] = {g.gathers, g.ahead, g.dropped, g.seconds};
    comm_.allreduce_max(most, 4, Group::world);
    j["zero_gathers"] = {{"ahead_of_use", sharding_->gathers_ahead()}, {"gathers", most[0]}, {"gathered_ahead", most[1]},
                         {"dropped", most[2]}, {"seconds", most[3]}};
  }
  j["precision"] = precision_name(cfg_.train.precision);
  if (scaler_ && scaler_->enabled()) {
    j["loss_scale"] = scaler_->scale();
    j["skipped_steps"] = scaler_->state().skipped;
  }
  j["ranks"] = comm_.size();
  j["placement"] = placement_json(places_);
  j["parameters"] = model_->params().parameter_count();
  j["resumed_from_step"] = resumed_from_ >= 0 ? nlohmann::json(resumed_from_) : nlohmann::json(nullptr);
  j["checkpoint_step"] = last_checkpoint_step_ >= 0 ? nlohmann::json(last_checkpoint_step_) : nlohmann::json(nullptr);
  j["output_dir"] = cfg_.run.output_dir;
  // The most activation slots (a micro-batch's activations of one chunk) any stage held at once
  // (1F1B: at most pp; GPipe: every micro-batch of the step; interleaved: slot_bound, each slot
  // 1/v of a stage).
  std::vector<double> peaks(static_cast<std::size_t>(comm_.pp()), 0.0);
  peaks[static_cast<std::size_t>(comm_.coord().pipeline)] = model_->peak_slots();
  comm_.allreduce_max(peaks.data(), peaks.size(), Group::world);
  j["peak_activation_slots"] = static_cast<int>(*std::max_element(peaks.begin(), peaks.end()));
  j["peak_activation_slots_by_stage"] = std::vector<int>(peaks.begin(), peaks.end());
  nlohmann::json memory;
  for (std::size_t c = 0; c < static_cast<std::size_t>(mem::Category::count); ++c)
    memory[std::string(mem::name(static_cast<mem::Category>(c))) + "_peak_bytes"] =
        mem::peak(static_cast<mem::Category>(c));
  memory["peak_total_bytes"] = mem::peak_total();
  memory["resident_peak_bytes"] = mem::resident_peak();
  j["memory"] = memory;
  return j;
}

void Trainer::log_memory() {
  using mem::Category;
  const auto mb = [](Category c) { return static_cast<double>(mem::peak(c)) / 1e6; };
  if (!mem::tracking_installed()) return;
  out_->log(fmt::format("memory per rank (measured peak, rank 0): parameters {:.2f} MB, gradients "
                        "{:.2f} MB, optimizer state {:.2f} MB, activations {:.2f} MB, comm buffers "
                        "{:.2f} MB, data {:.2f} MB, library buffers {:.2f} MB",
                        mb(Category::param), mb(Category::grad), mb(Category::optim),
                        mb(Category::act), mb(Category::comm), mb(Category::data), mb(Category::lib)));
}

ExitCode Trainer::stop() {
  out_->log(fmt::format("stop requested by signal: stopping after step {}, writing a checkpoint; "
                        "continue with --resume auto", state_.step));
  if (last_checkpoint_step_ != state_.step) checkpoint();
  finish_checkpoint();
  write_summary("stopped_by_signal");
  return ExitCode::signalled;
}

}  // namespace tessera
