// tessera check: validate a deck without training; print it resolved, the process grid (with the
// hosts of each group's ranks where the placement is known), a per-rank memory estimate and, for
// a transformer's context parallelism, the bytes a rank sends to its context group per step.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <mpi.h>

#include <algorithm>
#include <cstdlib>
#include <iostream>
#include <optional>
#include <thread>

#include "cli/commands.hpp"
#include "comm/agree.hpp"
#include "comm/communicator.hpp"
#include "core/deck.hpp"
#include "core/error.hpp"
#include "core/hostlist.hpp"
#include "core/memory.hpp"
#include "io/dataset.hpp"
#include "train/context_traffic.hpp"
#include "train/memory_estimate.hpp"
#include "train/placement.hpp"
#include "optim/state_file.hpp"
#include "train/sampler.hpp"
#include "train/threads.hpp"
#include "train/trainer.hpp"

namespace tessera::cli {

namespace {

std::string megabytes(double bytes) { return fmt::format("{:.2f} MB", bytes / 1e6); }

// Where the checked ranks will run, and how that is known.
struct Plan {
  std::vector<RankPlace> places;  ///< empty: unknown
  std::string source;
};

int cores_here() { return static_cast<int>(std::max(1u, std::thread::hardware_concurrency())); }

// --ranks-per-node K: blocks of K ranks on nodes named node0, node1, ... with this machine's cores.
Plan per_node_plan(const Config& cfg, int ranks, int per_node) {
  std::vector<std::string> hosts;
  for (int r = 0; r < ranks; ++r) hosts.push_back(fmt::format("node{}", r / per_node));
  return {planned_placement(cfg, hosts, cfg.parallel.data, cfg.parallel.tensor,
                            std::vector<int>(static_cast<std::size_t>(ranks), cores_here())),
          fmt::format("--ranks-per-node {} (nodes named node0, node1, ...; {} cores each, as this machine)",
                      per_node, cores_here())};
}

// Slurm's environment, block distribution: SLURM_JOB_NODELIST and SLURM_TASKS_PER_NODE, cores from
// SLURM_JOB_CPUS_PER_NODE (else this machine's).
std::optional<Plan> slurm_plan(const Config& cfg, int ranks) {
  const char* nodes = std::getenv("SLURM_JOB_NODELIST");
  const char* tasks = std::getenv("SLURM_TASKS_PER_NODE");
  if (nodes == nullptr || tasks == nullptr) return std::nullopt;
  const auto hosts = expand_hostlist(nodes, "SLURM_JOB_NODELIST");
  const auto per_host = expand_counts(tasks, "SLURM_TASKS_PER_NODE");
  const auto host_of_rank = block_placement(hosts, per_host, ranks);
  std::vector<int> cores(hosts.size(), cores_here());
  const char* cpus = std::getenv("SLURM_JOB_CPUS_PER_NODE");
  if (cpus != nullptr) {
    cores = expand_counts(cpus, "SLURM_JOB_CPUS_PER_NODE");
    if (cores.size() != hosts.size())
      throw InputError(fmt::format("SLURM_JOB_CPUS_PER_NODE = \"{}\" names {} nodes, SLURM_JOB_NODELIST {}", cpus,
                                   cores.size(), hosts.size()));
  }
  std::vector<int> cores_of_rank;
  for (std::size_t h = 0; h < hosts.size(); ++h)
    for (int i = 0; i < per_host[h] && static_cast<int>(cores_of_rank.size()) < ranks; ++i) cores_of_rank.push_back(cores[h]);
  return Plan{planned_placement(cfg, host_of_rank, cfg.parallel.data, cfg.parallel.tensor, cores_of_rank),
              fmt::format("Slurm: SLURM_JOB_NODELIST={} SLURM_TASKS_PER_NODE={}, block distribution{}", nodes, tasks,
                          cpus ? fmt::format(", SLURM_JOB_CPUS_PER_NODE={}", cpus)
                               : fmt::format(", {} cores per node as this machine", cores_here()))};
}

// The placement of the checked ranks, where it can be known: --ranks-per-node, else the ranks
// running the check when they are as many as the checked layout (collective over world), else
// Slurm's environment.
Plan plan_placement(const Config& cfg, int ranks, int ranks_per_node) {
  if (ranks_per_node > 0) return per_node_plan(cfg, ranks, ranks_per_node);
  if (world_size() == ranks) {
    const Communicator comm(MPI_COMM_WORLD, ranks, 1, 1);
    set_blas_threads(cfg, comm);
    const ThreadSetup threads = current_thread_setup();
    return {gather_placement(comm, cfg.parallel.data, cfg.parallel.tensor, threads.blas.threads,
                             threads.host_threads, cfg.parallel.spatial),
            "the ranks running this check"};
  }
  if (auto plan = slurm_plan(cfg, ranks)) return *plan;
  return {{}, ""};
}

// Which world ranks form each group of the grid rank = s + sp*(t + tp*(d + dp*p)), on which hosts.
void print_groups(const Config& cfg, int ranks, const Plan& plan) {
  const int dp = cfg.parallel.data, tp = cfg.parallel.tensor, pp = cfg.parallel.pipeline, sp = cfg.parallel.spatial;
  const int v = cfg.parallel.virtual_stages;
  std::cout << fmt::format("layout: data {} x tensor {} x pipeline {}{} = {} ranks, micro-batches {}{}, zero {}\n",
                           dp, tp, pp, sp > 1 ? fmt::format(" x spatial {}", sp) : "", ranks,
                           cfg.parallel.micro_batches,
                           v > 1 ? fmt::format(", {} chunks per stage (interleaved 1F1B)", v) : "", cfg.parallel.zero);
  for (const auto& g : grid_groups(dp, tp, pp, sp))
    std::cout << fmt::format("  {}: ranks [{}]{}\n", g.name, fmt::join(g.ranks, ","),
                             plan.places.empty()
                                 ? std::string()
                                 : fmt::format(" on hosts [{}]", fmt::join(group_hosts(plan.places, g.ranks), ",")));
  if (plan.places.empty()) {
    std::cout << "placement: unknown (run the check under the job's ranks, inside a Slurm allocation, or give "
                 "--ranks-per-node)\n";
    return;
  }
  const auto lines = describe_placement(plan.places, dp, tp, pp, sp);
  std::cout << fmt::format("placement from {}: {}\n", plan.source, lines.front().substr(7));  // after "ranks: "
  for (const auto& w : placement_warnings(plan.places, dp, tp, pp, sp)) std::cout << w << '\n';
}

void print_estimate(const Config& cfg, const ModelShape& shape, const MemoryEstimate& e,
                    std::int64_t train_samples) {
  std::cout << fmt::format("model: {}, {} parameters in {} bucket(s); {} steps per epoch\n",
                           describe_model(cfg, shape), e.parameter_count, e.buckets,
                           Sampler(train_samples, cfg.run.seed, cfg.train.global_batch, cfg.train.drop_last)
                               .batches_per_epoch());
  std::cout << fmt::format("memory per rank (estimate, ZeRO stage {}): parameters {}, gradients {}, "
                           "optimizer state {}, activations {} (micro-batch {}, eval batch {}), comm "
                           "buffers {}, input batch {}{}, total {}\n",
                           cfg.parallel.zero, megabytes(e.parameters), megabytes(e.gradients),
                           megabytes(e.optimizer), megabytes(e.activations), e.micro_batch,
                           e.eval_batch, megabytes(e.comm), megabytes(e.data),
                           e.checkpoint > 0 ? fmt::format(", checkpoint {} {}", cfg.checkpoint.async ? "staging" : "buffer",
                                                          megabytes(e.checkpoint))
                                            : std::string(),
                           megabytes(e.total()));
  if (e.offload_disk > 0)
    std::cout << fmt::format("{} on disk per rank (optimizer.offload = \"disk\"{}, under {}): {}\n",
                             cfg.optimizer.offload_values ? "optimizer state and parameter values" : "optimizer state",
                             cfg.optimizer.offload_values ? ", optimizer.offload_values = true" : "",
                             offload_dir(cfg.optimizer.offload_path), megabytes(e.offload_disk));
  if (e.offload_host > 0) {
    std::string what;
    if (cfg.optimizer.offload != OptimizerOffload::none)
      what = fmt::format("optimizer.offload = \"{}\": {}", to_string(cfg.optimizer.offload),
                         e.offload_disk > 0 ? "the state's disk tiles and the staging" : "the state and the staging");
    if (cfg.checkpoint.async) what += std::string(what.empty() ? "" : "; ") + "checkpoint.async: a save's staged copy";
    std::cout << fmt::format("host memory per rank beside the device's ({}): {}\n", what, megabytes(e.offload_host));
  }
  const mem::NodeMemory node = mem::node_memory();
  std::cout << fmt::format("this node: {:.2f} GB ({}); the estimate per rank must fit the node's memory "
                           "shared by its ranks\n", node.bytes / 1e9, node.source);
}

}  // namespace

int check(const DeckArgs& args, int ranks, int ranks_per_node) {
  const int rank = world_rank();
  const int n = ranks > 0 ? ranks : world_size();
  const Config cfg = load_config(args, n);
  const Plan plan = plan_placement(cfg, n, ranks_per_node);
  // The data: rank 0 opens it alone (the grid being checked need not be this run's). Everything
  // is checked before anything is printed.
  agree(MPI_COMM_WORLD, [&] {
    if (rank != 0) return;
    const auto train = io::open_split(MPI_COMM_SELF, cfg.data.path, cfg.data.train_split,
                                      cfg.model.context, false);
    const io::SplitInfo& info = train->info();
    const ModelShape shape = model_shape(cfg, info);
    const std::int64_t test_samples =
        eval_enabled(cfg.eval) ? io::open_split(MPI_COMM_SELF, cfg.data.path, cfg.data.test_split,
                                                cfg.model.context, false)->info().samples
                               : 0;
    const BatchRows rows = batch_rows(cfg, info.samples, test_samples);
    const MemoryEstimate estimate = estimate_memory(cfg, shape, rows);
    check_memory(cfg, estimate, 1, [&](const Config& c) { return estimate_memory(c, shape, rows); });
    if (!plan.places.empty()) check_tensor_within_node(cfg, plan.places);

    std::cout << "# resolved deck\n" << cfg.resolved_toml << "\n";
    print_groups(cfg, n, plan);
    std::cout << fmt::format("data: {} /{}: {} samples of {} features, {}\n", cfg.data.path,
                             cfg.data.train_split, info.samples, info.features,
                             shape.classification ? fmt::format("{} classes", shape.outputs)
                                                  : fmt::format("{} targets", shape.outputs));
    for (const std::string& warning : cfg.warnings) std::cout << "warning: " << warning << "\n";
    print_estimate(cfg, shape, estimate, info.samples);
    if (const std::string context = describe_context_traffic(cfg, shape, estimate.micro_batch); !context.empty())
      std::cout << context << "\n";
    std::cout << fmt::format("deck {} is valid for {} ranks\n", cfg.deck_path, n);
  });
  return 0;
}

}  // namespace tessera::cli
