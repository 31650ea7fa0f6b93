#pragma once
// The per-rank memory a run of a deck will need, estimated before anything is allocated from
// the model's real parameter layout (registered, not allocated): what `tessera check` prints.
#include <cstddef>
#include <cstdint>
#include <functional>

#include "comm/communicator.hpp"
#include "core/config.hpp"
#include "train/model.hpp"

namespace tessera {

/// Bytes per rank by category (the categories of core/memory.hpp's counters).
struct MemoryEstimate {
  double parameters = 0, gradients = 0, optimizer = 0, activations = 0, comm = 0, data = 0;
  /// optimizer.offload = "disk": the optimizer state in the rank's scratch file (optimizer then
  /// counts only the buffer it streams through); not part of total().
  double offload_disk = 0;
  /// optimizer.offload where the parameters are not in host memory (a GPU build): the host memory
  /// beside the device's, per rank (the state, or its disk tiles, and the staging); not part of
  /// total(), which is then the device's.
  double offload_host = 0;
  /// What a save holds beside the model: with checkpoint.async, the host copy of this rank's
  /// parameter values and optimizer state that each save stages while its writer runs; otherwise
  /// the buffer a synchronous save reads them into, a tensor at a time (the largest tensor's).
  /// Part of total(); on a GPU build in offload_host instead.
  double checkpoint = 0;
  std::int64_t micro_batch = 0;      ///< rows of the largest micro-batch
  std::int64_t eval_batch = 0;       ///< rows of the largest evaluation batch
  std::size_t parameter_count = 0;   ///< of the whole model
  std::size_t buckets = 0;           ///< gradient buckets as a run plans them
  double total() const { return parameters + gradients + optimizer + activations + comm + data + checkpoint; }
};

/// Rows of the batches a rank's buffers hold: as the deck asks, or fewer where the data hold fewer.
struct BatchRows {
  std::int64_t micro = 0;  ///< the largest micro-batch a data rank trains on
  std::int64_t eval = 0;   ///< the largest evaluation batch a data rank reads; 0: no evaluation
};

/// \brief The rows of cfg's batches on splits of train_samples and test_samples (0: no test
/// split): the global batch, or the whole split where a kept partial batch is the only one,
/// over data ranks and micro-batches; eval.batch, or a data rank's share of the test split where
/// that is smaller. A deck's eval.batch of 2^31 - 1 allocates no more than the split holds.
BatchRows batch_rows(const Config& cfg, std::int64_t train_samples, std::int64_t test_samples);

/// \brief Estimates one rank's memory for cfg (layout resolved) on data of the given shape, with
/// batches of `rows` (by default, the deck's nominal micro-batch and eval.batch). Local and
/// deterministic: no collective, no allocation beyond the parameter table; computed in double,
/// so no deck overflows it.
MemoryEstimate estimate_memory(const Config& cfg, const ModelShape& shape, const BatchRows& rows = {});

/// \brief InputError where `ranks_on_node` ranks of this estimate need more than the node's
/// memory (naming both, and the keys that drive the largest part), so that a run that cannot be
/// allocated is refused before it starts rather than failing or swapping in its first step.
/// `estimate_for` (a training run's): the estimate of another deck on the same data, so that the
/// refusal can name the offload settings that would fit.
void check_memory(const Config& cfg, const MemoryEstimate& e, int ranks_on_node,
                  const std::function<MemoryEstimate(const Config&)>& estimate_for = {});

/// \brief With run.memory_limit_mb: InputError on every rank where any rank's measured peak
/// (core/memory.hpp's counters, every category together) exceeds the limit. Collective over world;
/// call it once the first step has allocated what a step needs.
void check_memory_limit(const Config& cfg, const Communicator& comm);

}  // namespace tessera
