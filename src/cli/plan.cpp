// `tessera plan`: the step time of a deck's layout at a node count, before an allocation is spent
// on it, from an analytic model of the gradient exchange's bytes on each node's link and a
// compute time measured on a real run (docs/performance.md, "Choosing a layout": the model and
// how it compared with the namespace cluster's measurements).
//
// Per step, the busiest node's link carries (one direction) with B = the rank's gradient bytes
// in the wire type, F = its parameter bytes in fp32, M = the nodes a replica group spans:
//   allreduce (zero 0, any algorithm)          2 B (M-1)/M
//   ZeRO 1, 2 over the replica group           L (B + F) (M-1)/M        reduce-scatter + allgather
//   ZeRO 3 over the replica group              L (B + 2F) (M-1)/M       + the gathers of forward and backward
//   hybrid (parallel.zero_group = "node")      2 B (M-1)/M              only each shard's allreduce crosses
// L = 2: Open MPI 4.1's reduce-scatter and allgather moved twice the bandwidth optimum across the
// nodes of the namespace cluster (bench/cluster_layouts.sh); the allreduces met it. Tensor groups
// are assumed within a node and pipeline sends are not modelled. The step lies between
// max(compute, link) (the exchange hidden behind backward) and compute + link (nothing hidden).
//
// A transformer with parallel.spatial = C > 1 adds its context groups' traffic (the formulas in
// train/context_traffic.hpp): every message between two ranks of a group on different nodes leaves
// the one node's link and enters the other's; the busiest link's bytes in one direction give the
// context link time X. The all-to-alls block forward and backward, so compute becomes compute + X;
// the ring's hops may hide behind the attention, so only compute + X + link bounds it above. The
// link carries both: the step lies between max(compute (+ X), link + X) and compute + X + link.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <iostream>
#include <set>
#include <sstream>
#include <vector>

#include "cli/commands.hpp"
#include "core/deck.hpp"
#include "core/error.hpp"
#include "io/dataset.hpp"
#include "train/context_traffic.hpp"
#include "train/memory_estimate.hpp"
#include "train/trainer.hpp"

namespace tessera::cli {

namespace {

constexpr double kLibraryFactor = 2.0;  // measured, see above

// The median over a run's logged training steps of its compute phases (data, forward, backward,
// optimizer), from RUN_DIR/metrics.csv.
double compute_seconds_of(const std::string& run_dir) {
  const std::string path = run_dir + "/metrics.csv";
  std::ifstream in(path);
  if (!in) throw InputError(fmt::format("--from {}: cannot read {}", run_dir, path));
  std::string line;
  std::getline(in, line);
  std::vector<std::string> names;
  for (std::stringstream header(line); std::getline(header, line, ',');) names.push_back(line);
  const auto column = [&](const char* name) {
    const auto it = std::find(names.begin(), names.end(), name);
    if (it == names.end()) throw InputError(fmt::format("{}: no column {}", path, name));
    return static_cast<std::size_t>(it - names.begin());
  };
  const std::size_t kind = column("kind");
  const std::vector<std::size_t> phases = {column("t_data"), column("t_forward"), column("t_backward"),
                                           column("t_optimizer")};
  const std::size_t last = std::max(kind, *std::max_element(phases.begin(), phases.end()));
  std::vector<double> steps;
  for (std::string row_text; std::getline(in, row_text);) {
    std::vector<std::string> f;  // a trailing empty field is not read: only the columns used count
    for (std::stringstream row(row_text); std::getline(row, line, ',');) f.push_back(line);
    if (f.size() <= last || f[kind] != "train") continue;
    double s = 0.0;
    for (std::size_t c : phases) s += std::atof(f[c].c_str());
    steps.push_back(s);
  }
  if (steps.size() < 3) throw InputError(fmt::format("{}: fewer than 3 training rows to take a median of", path));
  steps.erase(steps.begin(), steps.begin() + 2);  // start-up
  std::nth_element(steps.begin(), steps.begin() + static_cast<std::ptrdiff_t>(steps.size() / 2), steps.end());
  return steps[steps.size() / 2];
}

// The context groups' bytes per step on the busiest node's link, one direction: every group
// (t, d, p) of the grid rank = s + sp*(t + tp*(d + dp*p)), ranks placed in blocks of ranks_per_node.
double context_link_bytes(const Config& cfg, const ModelShape& shape, int nodes, int ranks_per_node) {
  const auto& par = cfg.parallel;
  std::vector<double> out(static_cast<std::size_t>(nodes), 0.0), in(out);
  for (int p = 0; p < par.pipeline; ++p) {
    const ContextTraffic t = context_traffic(cfg, shape, p);
    for (int d = 0; d < par.data; ++d)
      for (int tr = 0; tr < par.tensor; ++tr) {
        const int first = par.spatial * (tr + par.tensor * (d + par.data * p));
        for (int r = 0; r < t.ranks; ++r)
          for (int q = 0; q < t.ranks; ++q) {
            const auto from = static_cast<std::size_t>((first + r) / ranks_per_node);
            const auto to = static_cast<std::size_t>((first + q) / ranks_per_node);
            if (from == to) continue;
            out[from] += t.between(r, q);
            in[to] += t.between(r, q);
          }
      }
  }
  return std::max(*std::max_element(out.begin(), out.end()), *std::max_element(in.begin(), in.end()));
}

struct Option {
  std::string name;
  int zero = 0;
  bool hybrid = false;
  bool bf16 = false;
};

}  // namespace

int plan(const DeckArgs& args, const PlanArgs& p) {
  if (p.nodes < 1 || p.ranks_per_node < 1 || !(p.link_gbps > 0.0))
    throw InputError("tessera plan: --nodes, --gpus-per-node and --link-gbps must be positive");
  if ((p.compute_s > 0.0) == !p.from.empty())
    throw InputError("tessera plan: give the compute time per step: --compute-s SECONDS or --from RUN_DIR "
                     "(a run of this deck's per-rank batch; its metrics.csv's median data + forward + "
                     "backward + optimizer time)");
  const int world = p.nodes * p.ranks_per_node;
  const Config cfg = load_config(args, world);
  const auto split = io::open_split(MPI_COMM_SELF, cfg.data.path, cfg.data.train_split, cfg.model.context, false);
  const ModelShape shape = model_shape(cfg, split->info());
  std::size_t parameters = 0;
  for (const auto& l : logical_params(cfg, shape)) parameters += l.size;
  const auto& par = cfg.parallel;
  const double per_rank = static_cast<double>(parameters) / (par.tensor * par.pipeline);
  const double compute = p.compute_s > 0.0 ? p.compute_s : compute_seconds_of(p.from);

  // The nodes one replica group (tensor rank 0, stage 0) spans, ranks placed in blocks of
  // ranks_per_node: rank = s + sp*(t + tp*(d + dp*p)).
  std::set<int> nodes;
  for (int d = 0; d < par.data; ++d)
    for (int s = 0; s < par.spatial; ++s) nodes.insert((s + par.spatial * par.tensor * d) / p.ranks_per_node);
  const double m = static_cast<double>(nodes.size()), cross = (m - 1.0) / m;
  // Context parallelism: the nodes the first context group spans, and the busiest link's share.
  std::set<int> context_nodes;
  for (int s = 0; s < par.spatial; ++s) context_nodes.insert(s / p.ranks_per_node);
  const double context_bytes = context_link_bytes(cfg, shape, p.nodes, p.ranks_per_node);
  const double context_s = context_bytes * 8.0 / (p.link_gbps * p.link_efficiency * 1e9);
  const double blocking = par.context_comm == ContextComm::all_to_all ? context_s : 0.0;

  std::vector<Option> options = {{"zero 0", 0, false, false}, {"zero 0, bf16 reduce", 0, false, true},
                                 {"zero 1", 1, false, false}, {"zero 3", 3, false, false},
                                 {"hybrid zero 1", 1, true, false}, {"hybrid zero 3", 3, true, false},
                                 {"hybrid zero 3, bf16 reduce", 3, true, true}};
  const Option deck{"this deck", par.zero, par.zero_group == ZeroGroup::node,
                    cfg.comm.reduce_dtype == ReduceDtype::bf16};
  options.insert(options.begin(), deck);
  if (world_rank() != 0) return 0;
  std::cout << fmt::format("plan: {} on {} nodes x {} ranks ({} ranks: data {} x tensor {} x pipeline {}{}), "
                           "links {} Gbit/s at {:.0f}%\n", cfg.deck_path, p.nodes, p.ranks_per_node, world, par.data,
                           par.tensor, par.pipeline,
                           par.spatial > 1 ? fmt::format(" x spatial {}", par.spatial) : std::string(),
                           p.link_gbps, 100.0 * p.link_efficiency);
  std::cout << fmt::format("model: {} parameters, {:.0f} per rank; a replica group spans {} node(s); compute "
                           "{:.4f} s per step ({})\n", parameters, per_rank, nodes.size(), compute,
                           p.from.empty() ? "--compute-s" : "measured in " + p.from);
  if (const std::string context = describe_context_traffic(cfg, shape); !context.empty())
    std::cout << context
              << fmt::format("; a context group spans {} node(s): the busiest node link carries {:.2f} MB of it per "
                             "step, {:.4f} s{}\n", context_nodes.size(), context_bytes / 1e6, context_s,
                             context_s == 0.0 ? ""
                             : blocking > 0.0 ? " added to compute (the all-to-alls block forward and backward)"
                                              : " (the ring's hops may hide behind the attention)");
  std::cout << "| layout | MB per node link per step | link s | step s (hidden .. not hidden) | samples/s |\n"
               "| --- | ---: | ---: | ---: | ---: |\n";
  for (const Option& o : options) {
    const double f = 4.0 * per_rank, b = (o.bf16 ? 2.0 : 4.0) * per_rank;
    double bytes = 0.0;
    if (o.zero == 0 || o.hybrid) bytes = 2.0 * b * cross;
    else if (o.zero <= 2) bytes = kLibraryFactor * (b + f) * cross;
    else bytes = kLibraryFactor * (b + 2.0 * f) * cross;
    if (o.hybrid && o.zero == 0) continue;
    const double link = bytes * 8.0 / (p.link_gbps * p.link_efficiency * 1e9);
    const double best = std::max(compute + blocking, link + context_s), worst = compute + context_s + link;
    std::cout << fmt::format("| {} | {:.2f} | {:.4f} | {:.4f} .. {:.4f} | {:.0f} .. {:.0f} |\n", o.name, bytes / 1e6,
                             link, best, worst, cfg.train.global_batch / worst, cfg.train.global_batch / best);
  }
  std::cout << "model: bytes per node link from the exchange's formulas (src/cli/plan.cpp), Open MPI's "
               "reduce-scatter/allgather at twice the optimum as measured; tensor and pipeline traffic "
               "not modelled; docs/performance.md compares it with measured steps\n";
  return 0;
}

}  // namespace tessera::cli
