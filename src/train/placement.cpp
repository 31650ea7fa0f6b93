#include "train/placement.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <map>
#include <sstream>

#include "comm/flight_record.hpp"
#include "core/error.hpp"

namespace tessera {

namespace {

std::vector<std::string> distinct(std::vector<std::string> v) {
  std::vector<std::string> out;
  for (auto& s : v)
    if (std::find(out.begin(), out.end(), s) == out.end()) out.push_back(std::move(s));
  return out;
}

RankPlace place_of(int rank, int dp, int tp, int sp) {
  RankPlace r;
  r.rank = rank;
  r.spatial = rank % sp;
  r.tensor = (rank / sp) % tp;
  r.data = (rank / (sp * tp)) % dp;
  r.pipeline = rank / (sp * tp * dp);
  return r;
}

}  // namespace

std::vector<GridGroup> grid_groups(int dp, int tp, int pp, int sp) {
  auto rank_of = [&](int d, int t, int p, int s) { return s + sp * (t + tp * (d + dp * p)); };
  // Where there is a spatial dimension, each group name says its spatial coordinate too.
  const auto at = [&](int s) { return sp > 1 ? fmt::format(",s={}", s) : std::string(); };
  std::vector<GridGroup> out;
  for (int s = 0; s < sp; ++s)
    for (int p = 0; p < pp; ++p)
      for (int t = 0; t < tp; ++t) {
        GridGroup g{fmt::format("data group (t={},p={}{})", t, p, at(s)), {}};
        for (int d = 0; d < dp; ++d) g.ranks.push_back(rank_of(d, t, p, s));
        out.push_back(std::move(g));
      }
  for (int s = 0; s < sp; ++s)
    for (int p = 0; p < pp; ++p)
      for (int d = 0; d < dp; ++d) {
        GridGroup g{fmt::format("tensor group (d={},p={}{})", d, p, at(s)), {}};
        for (int t = 0; t < tp; ++t) g.ranks.push_back(rank_of(d, t, p, s));
        out.push_back(std::move(g));
      }
  for (int s = 0; s < sp; ++s)
    for (int d = 0; d < dp; ++d)
      for (int t = 0; t < tp; ++t) {
        GridGroup g{fmt::format("pipeline group (d={},t={}{})", d, t, at(s)), {}};
        for (int p = 0; p < pp; ++p) g.ranks.push_back(rank_of(d, t, p, s));
        out.push_back(std::move(g));
      }
  if (sp == 1) return out;
  for (int p = 0; p < pp; ++p)
    for (int d = 0; d < dp; ++d)
      for (int t = 0; t < tp; ++t) {
        GridGroup g{fmt::format("spatial group (d={},t={},p={})", d, t, p), {}};
        for (int s = 0; s < sp; ++s) g.ranks.push_back(rank_of(d, t, p, s));
        out.push_back(std::move(g));
      }
  return out;
}

std::vector<std::string> group_hosts(const std::vector<RankPlace>& places, const std::vector<int>& ranks) {
  std::vector<std::string> hosts;
  for (int r : ranks) hosts.push_back(places[static_cast<std::size_t>(r)].host);
  return hosts;
}

int blas_threads_for(const Config& cfg, int cores, int ranks_on_node, int allowed) {
  if (cfg.run.blas_threads > 0) return cfg.run.blas_threads;
  return std::max(1, std::min(allowed, cores / std::max(1, ranks_on_node)));
}

std::string host_name() {
  char name[HOST_NAME_MAX + 1] = {};
  if (gethostname(name, sizeof name - 1) != 0) return "unknown";
  return name;
}

std::vector<RankPlace> gather_placement(const Communicator& comm, int dp, int tp,
                                        int blas_threads, int kokkos_threads, int sp) {
  const std::vector<std::string> all =
      comm.allgather_strings(fmt::format("{} {} {}", blas_threads, kokkos_threads, host_name()), Group::world);
  std::vector<RankPlace> places;
  for (std::size_t r = 0; r < all.size(); ++r) {
    RankPlace p = place_of(static_cast<int>(r), dp, tp, sp);
    std::istringstream in(all[r]);
    in >> p.blas_threads >> p.kokkos_threads >> p.host;
    places.push_back(p);
  }
  return places;
}

std::vector<RankPlace> planned_placement(const Config& cfg, const std::vector<std::string>& host_of_rank,
                                         int dp, int tp, const std::vector<int>& cores_of_rank) {
  std::map<std::string, int> per_host;
  for (const auto& h : host_of_rank) ++per_host[h];
  std::vector<RankPlace> places;
  for (std::size_t r = 0; r < host_of_rank.size(); ++r) {
    RankPlace p = place_of(static_cast<int>(r), dp, tp, cfg.parallel.spatial);
    p.host = host_of_rank[r];
    p.blas_threads = blas_threads_for(cfg, cores_of_rank[r], per_host[p.host]);
    p.kokkos_threads = 0;  // not known before the run
    places.push_back(p);
  }
  return places;
}

std::vector<std::string> describe_placement(const std::vector<RankPlace>& places, int dp, int tp, int pp,
                                            int sp) {
  std::vector<std::string> lines;
  std::vector<std::string> hosts;
  std::map<std::string, std::vector<int>> ranks_on;
  for (const auto& p : places) {
    if (!ranks_on.count(p.host)) hosts.push_back(p.host);
    ranks_on[p.host].push_back(p.rank);
  }
  std::vector<std::string> per_host;
  for (const auto& h : hosts) per_host.push_back(fmt::format("{} [{}]", h, comm::rank_list(ranks_on[h])));
  lines.push_back(fmt::format("ranks: {} on {} host{}: {}", places.size(), hosts.size(), hosts.size() == 1 ? "" : "s",
                              fmt::join(per_host, ", ")));
  for (const auto& p : places)
    lines.push_back(fmt::format("  rank {} host {} data {} tensor {} pipeline {}{} blas_threads {}{}", p.rank, p.host,
                                p.data, p.tensor, p.pipeline, sp > 1 ? fmt::format(" spatial {}", p.spatial) : "",
                                p.blas_threads,
                                p.kokkos_threads > 0 ? fmt::format(" kokkos_threads {}", p.kokkos_threads) : ""));
  for (const auto& g : grid_groups(dp, tp, pp, sp))
    if (g.ranks.size() > 1)
      lines.push_back(fmt::format("  {}: ranks [{}] on hosts [{}]", g.name, fmt::join(g.ranks, ","),
                                  fmt::join(group_hosts(places, g.ranks), ",")));
  return lines;
}

std::vector<std::string> placement_warnings(const std::vector<RankPlace>& places, int dp, int tp, int pp,
                                            int sp) {
  std::vector<std::string> lines;
  for (const auto& g : grid_groups(dp, tp, pp, sp)) {
    const bool tensor = g.name.rfind("tensor", 0) == 0, spatial = g.name.rfind("spatial", 0) == 0;
    if (!tensor && !spatial) continue;
    const auto hosts = distinct(group_hosts(places, g.ranks));
    if (hosts.size() > 1 && tensor)
      lines.push_back(fmt::format("warning: {} (ranks [{}]) spans hosts {}: its sums cross the network in every "
                                  "layer; place whole tensor groups on one node (parallel.tensor_within_node = "
                                  "true makes this an error)", g.name, fmt::join(g.ranks, ","), fmt::join(hosts, ", ")));
    else if (hosts.size() > 1)
      lines.push_back(fmt::format("warning: {} (ranks [{}]) spans hosts {}: its halos cross the network before "
                                  "every convolution; place whole spatial groups on one node", g.name,
                                  fmt::join(g.ranks, ","), fmt::join(hosts, ", ")));
  }
  std::map<int, std::vector<int>> by_threads;
  for (const auto& p : places) by_threads[p.blas_threads].push_back(p.rank);
  if (by_threads.size() > 1) {
    std::vector<std::string> parts;
    for (const auto& [threads, ranks] : by_threads)
      parts.push_back(fmt::format("{} on rank{} {}", threads, ranks.size() == 1 ? "" : "s", comm::rank_list(ranks)));
    lines.push_back(fmt::format("warning: ranks have different BLAS thread counts ({}): bitwise equality across "
                                "layouts needs the same BLAS thread count per rank; set run.blas_threads",
                                fmt::join(parts, ", ")));
  }
  return lines;
}

void check_tensor_within_node(const Config& cfg, const std::vector<RankPlace>& places) {
  if (!cfg.parallel.tensor_within_node) return;
  for (const auto& g : grid_groups(cfg.parallel.data, cfg.parallel.tensor, cfg.parallel.pipeline, cfg.parallel.spatial)) {
    if (g.name.rfind("tensor", 0) != 0) continue;
    const auto hosts = distinct(group_hosts(places, g.ranks));
    if (hosts.size() > 1)
      throw InputError(fmt::format("parallel.tensor_within_node = true, but the {} (ranks [{}]) spans hosts {}; "
                                   "place ranks in blocks of parallel.tensor = {} per node (srun --distribution="
                                   "block, mpirun --map-by ppr:N:node with N a multiple of {})",
                                   g.name, fmt::join(g.ranks, ","), fmt::join(hosts, ", "), cfg.parallel.tensor,
                                   cfg.parallel.tensor));
  }
}

nlohmann::json placement_json(const std::vector<RankPlace>& places) {
  nlohmann::json a = nlohmann::json::array();
  for (const auto& p : places)
    a.push_back({{"rank", p.rank}, {"host", p.host}, {"data", p.data}, {"tensor", p.tensor},
                 {"pipeline", p.pipeline}, {"spatial", p.spatial}, {"blas_threads", p.blas_threads},
                 {"kokkos_threads", p.kokkos_threads}});
  return a;
}

}  // namespace tessera
