#pragma once
// One function per subcommand; each runs on every rank of MPI_COMM_WORLD.
#include <string>
#include <vector>

#include "core/config.hpp"

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


int train(const DeckArgs& args, const std::string& resume);
int check(const DeckArgs& args, int ranks);
int eval(const DeckArgs& args, const std::string& checkpoint);
int prepare_fashion_mnist(const std::string& out, const std::string& source);
int prepare_text(const std::vector<std::string>& inputs, const std::string& out, double val_fraction);
int inspect(const std::string& checkpoint);


}  // namespace tessera::cli
