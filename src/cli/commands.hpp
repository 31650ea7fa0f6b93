#pragma once
// One function per subcommand; each runs on every rank of MPI_COMM_WORLD.
#include <string>
#include <vector>

#include "comm/communicator.hpp"
#include "core/config.hpp"
#include "sci/darcy_dataset.hpp"

namespace tessera::cli {

struct DeckArgs {
  std::string deck;
  std::vector<std::string> overrides;  ///< --set section.key=value
};

/// Rank and size of MPI_COMM_WORLD.
int world_rank();
int world_size();

/// Loads the deck with its overrides and resolves the layout for `ranks`; throws InputError.
Config load_config(const DeckArgs& args, int ranks);

/// The process grid of a resolved deck: parallel.data, tensor, pipeline and spatial.
GridShape grid_shape(const Config& cfg);

/// \brief Sets this rank's BLAS threads: run.blas_threads, or the cores this rank may use shared
/// among its node's ranks (train/placement.hpp's blas_threads_for).
void set_blas_threads(const Config& cfg, const Communicator& comm);

int train(const DeckArgs& args, const std::string& resume);
/// `tessera check`: `ranks_per_node` > 0 places the checked ranks that many per node (block).
int check(const DeckArgs& args, int ranks, int ranks_per_node);
int eval(const DeckArgs& args, const std::string& checkpoint);
int prepare_fashion_mnist(const std::string& out, const std::string& source);
int prepare_text(const std::vector<std::string>& inputs, const std::string& out, double val_fraction);
/// `tessera prepare darcy`: every rank of the world solves and writes its block of rows of each sample.
int prepare_darcy(const sci::DarcyOptions& options);
int inspect(const std::string& checkpoint);

/// `tessera plan DECK --nodes N --gpus-per-node G --link-gbps X (--compute-s S | --from RUN)`.
struct PlanArgs {
  int nodes = 0, ranks_per_node = 0;
  double link_gbps = 0.0, compute_s = 0.0;
  double link_efficiency = 1.0;  ///< the fraction of the link's rate the exchange reaches
  std::string from;  ///< a run directory whose metrics.csv gives the compute time per step
};
/// \brief Prints the predicted step time of the deck's layout and of its sharding alternatives
/// on N nodes (src/cli/plan.cpp has the model). Every rank computes it; rank 0 prints.
int plan(const DeckArgs& args, const PlanArgs& p);


}  // namespace tessera::cli
