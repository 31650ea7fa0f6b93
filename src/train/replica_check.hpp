#pragma once
// train.check_replicas_every: the data replicas compare checksums of what they should hold
// identically (parameters, and optimizer state where it is not sharded), so a replica that went
// its own way (a bad node, a bug) stops the run within K steps instead of training on silently.
#include <cstdint>

#include "comm/communicator.hpp"
#include "core/config.hpp"
#include "optim/optimizer.hpp"
#include "train/sharding.hpp"
#include "train/model.hpp"

namespace tessera {

/// \brief What the data replicas hold alike under this deck: "parameters and optimizer state"
/// (ZeRO 0), "parameters" (ZeRO 1, 2), or "" (ZeRO 3 shards everything; one replica).
const char* replicated_state(const Sharding& sharding, const Communicator& comm);

/// \brief Compares, over each replica group (the data group, times the spatial group where
/// parallel.spatial > 1), the checksum of every tensor block replicated_state() names
/// (io/tensor_check.hpp's element checksum over the block). Where a replica's block
/// differs from its group's first rank, every rank throws the same NumericError naming the step,
/// the first tensor that differs and the world ranks on either side. Collective over world.
/// Test hook: TESSERA_TEST_PERTURB_REPLICA=STEP makes replica rank 1 of each group add 1e-3 to its
/// first parameter value just before the check after that step.
void check_replicas(const Config& cfg, const Communicator& comm, Model& model, const Sharding& sharding,
                    const Optimizer& opt, std::int64_t step);

}  // namespace tessera
