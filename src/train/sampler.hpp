#pragma once
// The distributed sampler of DESIGN.md.
//
// The permutation for epoch e is a pure function of (seed, e); global batch k is the k-th
// contiguous slice of it; data rank r takes the r-th contiguous part of each global batch and
// micro-batch m the m-th part of that. Whatever the rank count, global batch k holds the same
// samples, which is what makes the losses independent of the layout.
#include <cstdint>
#include <span>
#include <vector>

namespace tessera {

class Sampler {
 public:
  /// \param samples size of the split; \param global_batch samples per optimizer step;
  /// \param drop_last drop the last partial global batch of every epoch.
  Sampler(std::int64_t samples, std::uint64_t seed, std::int64_t global_batch, bool drop_last);

  std::int64_t batches_per_epoch() const { return batches_per_epoch_; }
  std::int64_t samples() const { return samples_; }

  /// Global batch k of epoch e (k < batches_per_epoch()); the last may be short without drop_last.
  std::span<const std::int64_t> global_batch(std::int64_t epoch, std::int64_t k);

  /// The permutation of epoch e (cached: recomputed only when e changes).
  const std::vector<std::int64_t>& permutation(std::int64_t epoch);

  /// Part r of `parts` contiguous, near-equal parts of s (the first s.size() % parts parts get one more).
  static std::span<const std::int64_t> part(std::span<const std::int64_t> s, int r, int parts);

 private:
  std::int64_t samples_, global_batch_, batches_per_epoch_;
  std::uint64_t seed_;
  std::int64_t cached_epoch_ = -1;
  std::vector<std::int64_t> perm_;
};

}  // namespace tessera
