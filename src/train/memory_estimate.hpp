#pragma once
// The per-rank memory a run of a deck will need, estimated before anything is allocated from
// the model's real parameter layout (registered, not allocated): what `tessera check` prints.
#include <cstddef>
#include <cstdint>

#include "core/config.hpp"
#include "train/model.hpp"

namespace tessera {

/// Bytes per rank by category (the categories of core/memory.hpp's counters).
struct MemoryEstimate {
  double parameters = 0, gradients = 0, optimizer = 0, activations = 0, comm = 0, data = 0;
  std::int64_t micro_batch = 0;      ///< rows of the largest micro-batch
  std::size_t parameter_count = 0;   ///< of the whole model
  std::size_t buckets = 0;           ///< gradient buckets as a run plans them
  double total() const { return parameters + gradients + optimizer + activations + comm + data; }
};

/// \brief Estimates one rank's memory for cfg (layout resolved) on data of the given shape.
/// Local and deterministic: no collective, no allocation beyond the parameter table.
MemoryEstimate estimate_memory(const Config& cfg, const ModelShape& shape);

}  // namespace tessera
