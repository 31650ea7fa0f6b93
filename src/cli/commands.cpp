// train, eval, prepare and inspect. (check is in check.cpp.)
#include "cli/commands.hpp"

#include <fmt/format.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <iostream>
#include <memory>
#include <thread>

#include "blas/gemm.hpp"
#include "blas/gemm_library.hpp"
#include "comm/agree.hpp"
#include "comm/communicator.hpp"
#include "comm/watchdog.hpp"
#include "core/deck.hpp"
#include "core/error.hpp"
#include "io/inspect.hpp"
#include "io/prepare.hpp"
#include "io/prepare_text.hpp"
#include "sci/darcy_dataset.hpp"
#include "train/checkpointer.hpp"
#include "train/field_norm.hpp"
#include "train/memory_estimate.hpp"
#include "train/placement.hpp"
#include "train/stop_signal.hpp"
#include "train/trainer.hpp"

namespace tessera::cli {

int world_rank() {
  int rank = 0;
  MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
  return rank;
}

int world_size() {
  int n = 1;
  MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &n));
  return n;
}

namespace {

/// Where the run's buffers (parameters, gradients) live: device memory under a CUDA Kokkos.
constexpr BufferSpace kBuffers = Kokkos::SpaceAccessibility<HostSpace, MemSpace>::accessible
                                     ? BufferSpace::host
                                     : BufferSpace::device;

// The watchdog of a run (comm/watchdog.hpp). The run's id in the flight records is rank 0's start
// time, broadcast: collective over world.
std::unique_ptr<comm::Watchdog> start_watchdog(const Config& cfg, const Communicator& comm) {
  comm::RecordIdentity who;
  if (comm.is_root()) who.run = comm::iso_time(comm::unix_seconds());
  comm.broadcast(who.run, 0, Group::world);
  who.run_dir = cfg.run.output_dir;
  who.rank = comm.rank();
  who.ranks = comm.size();
  who.host = host_name();
  who.pid = static_cast<long>(getpid());
  who.data = comm.coord().data;
  who.tensor = comm.coord().tensor;
  who.pipeline = comm.coord().pipeline;
  who.spatial = comm.coord().spatial;
  who.dp = comm.dp();
  who.tp = comm.tp();
  who.pp = comm.pp();
  who.sp = comm.sp();
  who.timeout_s = cfg.comm.timeout_s;
  return std::make_unique<comm::Watchdog>(comm::WatchdogSetup{who, [] { return stop_signal(); }});
}

// Runs a command's body under the watchdog. A local failure (anything but bad input or a
// numerical failure, which every rank reaches alike) writes this rank's flight record on its way
// to main's MPI_Abort.
template <class Body>
int watched(const Config& cfg, const Communicator& comm, Body&& body) {
  const auto watchdog = start_watchdog(cfg, comm);
  try {
    return body();
  } catch (const InputError&) {
    throw;
  } catch (const NumericError&) {
    throw;
  } catch (const std::exception& e) {
    watchdog->write_record("internal_error", e.what());
    throw;
  }
}

}  // namespace

void set_blas_threads(const Config& cfg, const Communicator& comm) {
  cpu_set_t set;
  CPU_ZERO(&set);
  const int allowed = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 1;
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  blas::set_threads(blas_threads_for(cfg, cores, comm.ranks_on_node(), allowed));
}

Config load_config(const DeckArgs& args, int ranks) {
  Config cfg = load_deck(args.deck, args.overrides);
  resolve_layout(cfg, ranks);
  return cfg;
}

GridShape grid_shape(const Config& cfg) {
  const auto& p = cfg.parallel;
  return GridShape{p.data, p.tensor, p.pipeline, p.spatial};
}

int train(const DeckArgs& args, const std::string& resume) {
  const Config cfg = load_config(args, world_size());
  const Communicator comm(MPI_COMM_WORLD, grid_shape(cfg), cfg.comm, kBuffers);
  set_blas_threads(cfg, comm);
  blas::set_gemm_library(cfg.run.gemm);
  install_stop_handlers();
  return watched(cfg, comm, [&] {
    Trainer trainer(cfg, comm, ResumeRequest::parse(resume));
    return static_cast<int>(trainer.run());
  });
}

int eval(const DeckArgs& args, const std::string& checkpoint) {
  const Config cfg = load_config(args, world_size());
  const Communicator comm(MPI_COMM_WORLD, grid_shape(cfg), cfg.comm, kBuffers);
  set_blas_threads(cfg, comm);
  blas::set_gemm_library(cfg.run.gemm);
  return watched(cfg, comm, [&] {
    std::unique_ptr<io::Split> split;
    {
      const auto watch = comm.watch("dataset open", Group::data);
      split = io::open_split(comm.handle(Group::data), cfg.data.path, cfg.data.test_split, cfg.model.context,
                             cfg.data.cache, data_cache_limit(comm), sample_block(cfg, comm));
    }
    io::Split& test = *split;
    ModelShape shape = model_shape(cfg, test.info());
    std::string norm_note;
    if (normalizes_fields(cfg)) {  // the checkpoint's statistics, or the training split's as training computed them
      std::unique_ptr<io::Split> train;
      const nn::UNetShape u = unet_shape(cfg, shape);
      shape.norm = choose_field_norm(cfg, comm, checkpoint, u.in_channels, u.out_channels, [&]() -> io::Split& {
        const auto watch = comm.watch("dataset open", Group::data);
        train = io::open_split(comm.handle(Group::data), cfg.data.path, cfg.data.train_split, cfg.model.context,
                               false, data_cache_limit(comm), sample_block(cfg, comm));
        return *train;
      }, &norm_note);
    }
    const BatchRows rows = batch_rows(cfg, 1, test.info().samples);
    MemoryEstimate estimate = estimate_memory(cfg, shape, {rows.eval, rows.eval});
    estimate.gradients = estimate.optimizer = estimate.comm = 0;  // evaluation holds neither
    check_memory(cfg, estimate, comm.ranks_on_node());
    Model model(cfg, shape, static_cast<int>(rows.eval), {}, model_part(cfg, comm, shape));
    {
      const auto watch = comm.watch("checkpoint read", Group::world);
      Checkpointer(cfg, comm).load_model(checkpoint, model);
    }
    const EvalResult e = evaluate(cfg, comm, model, test);
    // The loss with 9 significant digits (float32's round trip), and what a sample is.
    const std::string samples = is_transformer(cfg.model.kind)
                                    ? fmt::format("{} windows of {} tokens; loss and accuracy per token",
                                                  e.samples, cfg.model.context)
                                    : fmt::format("{} samples", e.samples);
    if (comm.is_root() && !norm_note.empty()) std::cout << norm_note << '\n';
    if (comm.is_root())
      std::cout << fmt::format("eval {} on {} /{}: test loss {:.9g}{}{} ({})\n", checkpoint, cfg.data.path,
                               cfg.data.test_split, e.loss,
                               std::isnan(e.accuracy) ? std::string() : fmt::format(" accuracy {:.6f}", e.accuracy),
                               std::isnan(e.rel_l2) ? std::string() : fmt::format(" relative L2 error {:.6f}", e.rel_l2),
                               samples);
    return 0;
  });
}

int prepare_fashion_mnist(const std::string& out, const std::string& source) {
  const int rank = world_rank();
  agree(MPI_COMM_WORLD, [&] {
    if (rank != 0) return;
    io::prepare_fashion_mnist(source, out);
    std::cout << fmt::format("wrote {} from {}\n", out, source);
  });
  return 0;
}

int prepare_text(const std::vector<std::string>& inputs, const std::string& out, double val_fraction) {
  const int rank = world_rank();
  agree(MPI_COMM_WORLD, [&] {
    if (rank != 0) return;
    const io::TextSplits splits = io::prepare_text(inputs, out, val_fraction);
    std::cout << fmt::format("wrote {}: {} train and {} val byte tokens from {} file{}\n", out, splits.train,
                             splits.val, inputs.size(), inputs.size() == 1 ? "" : "s");
  });
  return 0;
}

int prepare_darcy(const sci::DarcyOptions& options) {
  sci::check_darcy_options(options, world_size());  // the same on every rank: before any collective
  const Communicator comm(MPI_COMM_WORLD, GridShape{1, 1, 1, world_size()});
  const sci::DarcySummary s = sci::prepare_darcy(comm, options);
  if (comm.is_root())
    std::cout << fmt::format("wrote {}: {} train and {} test Darcy samples of {} x {} on {} rank(s); conjugate "
                             "gradients took at most {} iterations to a relative residual <= {:.3g}\n",
                             options.out, options.train, options.test, options.size, options.size, world_size(),
                             s.most_iterations, s.worst_residual);
  return 0;
}

int inspect(const std::string& checkpoint) {
  const int rank = world_rank();
  agree(MPI_COMM_WORLD, [&] {
    if (rank == 0) io::inspect_checkpoint(checkpoint, std::cout);
  });
  return 0;
}

}  // namespace tessera::cli
