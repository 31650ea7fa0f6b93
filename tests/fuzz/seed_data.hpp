#pragma once
// The shape of the tiny supervised dataset that make_seed_data.cpp writes and on which
// make_seeds.sh trains the model of seed_mlp.toml for the checkpoint seed; fuzz_checkpoint.cpp
// builds that model to load fuzzed checkpoints into.
#include <cstdint>

namespace tessera::fuzz {

inline constexpr std::int64_t kSeedImageSide = 4;  ///< inputs uint8 [N, 4, 4]
inline constexpr std::int64_t kSeedClasses = 3;    ///< labels uint8 [N] in [0, 3)
inline constexpr std::int64_t kSeedTrainSamples = 24;
inline constexpr std::int64_t kSeedTestSamples = 8;

}  // namespace tessera::fuzz
