#pragma once
// Checks that involve more than one key. Internal to core/deck*.cpp.
#include <map>
#include <string>

#include "core/config.hpp"

namespace tessera::deck {

/// Where each key got its value: "path:line" or "--set k=v"; keys left at their default are absent.
using Origins = std::map<std::string, std::string>;

/// The combinations known without the world size (nesterov without momentum, min_lr above lr,
/// nothing to train, comm.backend = "nccl" in a build without NCCL or with an allreduce algorithm
/// of Tessera's own). Throws InputError at the first key named that the deck or an override set.
/// Allowed combinations that are likely not meant (a warm-up as long as the run) add a line to
/// cfg.warnings.
void check_combinations(Config& cfg, const Origins& origins);

}  // namespace tessera::deck
