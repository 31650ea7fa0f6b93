#pragma once
// Where every rank runs: its host, grid coordinates and thread counts, gathered at start-up so
// that rank 0 can log the table, put it in summary.json and check it: a tensor group should sit
// on one node (its sums run every layer), and bitwise equality across layouts needs the same BLAS
// thread count on every rank (OpenBLAS's summation order depends on it; DESIGN.md's invariant).
// `tessera check` builds the same table from a planned placement (Slurm's environment or
// --ranks-per-node) before the job runs.
#include <climits>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "comm/communicator.hpp"
#include "core/config.hpp"

namespace tessera {

struct RankPlace {
  int rank = 0;
  std::string host;
  int data = 0, tensor = 0, pipeline = 0, spatial = 0;
  int blas_threads = 1;
  int kokkos_threads = 1;
};

/// One group of the grid: "data group (t=0,p=1)" and its world ranks in group-rank order.
struct GridGroup {
  std::string name;
  std::vector<int> ranks;
};
/// \brief Every group of the grid rank = s + sp*(t + tp*(d + dp*p)): data groups, then tensor,
/// pipeline and (sp > 1) spatial.
std::vector<GridGroup> grid_groups(int dp, int tp, int pp, int sp = 1);
/// \brief The host of each of `ranks`.
std::vector<std::string> group_hosts(const std::vector<RankPlace>& places, const std::vector<int>& ranks);

/// \brief BLAS threads a rank gets: run.blas_threads, or (0) the `cores` of its node shared among
/// the `ranks_on_node` ranks there, at most the `allowed` cores of its affinity mask, at least 1.
int blas_threads_for(const Config& cfg, int cores, int ranks_on_node, int allowed = INT_MAX);

/// \brief This process's host name.
std::string host_name();

/// \brief Every rank's place, on every rank: host and thread counts gathered over world, grid
/// coordinates from the rank (rank = s + sp*(t + tp*(d + dp*p))). Collective over world.
std::vector<RankPlace> gather_placement(const Communicator& comm, int dp, int tp,
                                        int blas_threads, int kokkos_threads, int sp = 1);

/// \brief A placement from the host of each rank (planned, not measured): each rank's BLAS
/// threads as blas_threads_for() would give them, from run.blas_threads or from the cores of its
/// host (`cores_of_rank`) shared among that host's ranks; Kokkos threads unknown (0). The spatial
/// dimension is cfg's parallel.spatial.
std::vector<RankPlace> planned_placement(const Config& cfg, const std::vector<std::string>& host_of_rank,
                                         int dp, int tp, const std::vector<int>& cores_of_rank);

/// \brief Log lines: "ranks: ..." (hosts and their ranks), one line per rank, one line per group
/// naming the hosts of its ranks.
std::vector<std::string> describe_placement(const std::vector<RankPlace>& places, int dp, int tp, int pp,
                                            int sp = 1);

/// \brief Warning lines ("warning: ..."): tensor and spatial groups across hosts; BLAS thread
/// counts that differ between ranks. Empty when all is well.
std::vector<std::string> placement_warnings(const std::vector<RankPlace>& places, int dp, int tp, int pp,
                                            int sp = 1);

/// \brief With parallel.tensor_within_node, throws InputError naming the first tensor group whose
/// ranks are on more than one host.
void check_tensor_within_node(const Config& cfg, const std::vector<RankPlace>& places);

/// \brief The table for summary.json: one object per rank.
nlohmann::json placement_json(const std::vector<RankPlace>& places);

}  // namespace tessera
