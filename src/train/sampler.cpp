#include "train/sampler.hpp"

#include <numeric>
#include <stdexcept>

#include "kernels/random.hpp"

namespace tessera {

Sampler::Sampler(std::int64_t samples, std::uint64_t seed, std::int64_t global_batch,
                 bool drop_last)
    : samples_(samples), global_batch_(global_batch), seed_(seed) {
  if (samples <= 0 || global_batch <= 0) throw std::logic_error("Sampler: empty split or batch");
  batches_per_epoch_ = drop_last ? samples / global_batch : (samples + global_batch - 1) / global_batch;
}

const std::vector<std::int64_t>& Sampler::permutation(std::int64_t epoch) {
  if (epoch == cached_epoch_) return perm_;
  // Fisher-Yates driven by a counter-based generator: draw i depends only on (seed, epoch, i).
  perm_.resize(static_cast<std::size_t>(samples_));
  std::iota(perm_.begin(), perm_.end(), std::int64_t{0});
  const std::uint64_t stream = kernels::hash_name("sampler.epoch") + static_cast<std::uint64_t>(epoch);
  for (std::int64_t i = samples_ - 1; i > 0; --i) {
    const double u = kernels::uniform01(seed_, stream, static_cast<std::uint64_t>(i));
    auto j = static_cast<std::int64_t>(u * static_cast<double>(i + 1));
    if (j > i) j = i;
    std::swap(perm_[static_cast<std::size_t>(i)], perm_[static_cast<std::size_t>(j)]);
  }
  cached_epoch_ = epoch;
  return perm_;
}

std::span<const std::int64_t> Sampler::global_batch(std::int64_t epoch, std::int64_t k) {
  if (k < 0 || k >= batches_per_epoch_) throw std::out_of_range("Sampler: batch index");
  const auto& p = permutation(epoch);
  const std::int64_t begin = k * global_batch_;
  const std::int64_t end = std::min(begin + global_batch_, samples_);
  return std::span<const std::int64_t>(p).subspan(static_cast<std::size_t>(begin),
                                                  static_cast<std::size_t>(end - begin));
}

std::span<const std::int64_t> Sampler::part(std::span<const std::int64_t> s, int r, int parts) {
  const std::size_t n = s.size(), q = n / static_cast<std::size_t>(parts),
                    extra = n % static_cast<std::size_t>(parts), ur = static_cast<std::size_t>(r);
  const std::size_t begin = ur * q + std::min(ur, extra);
  const std::size_t len = q + (ur < extra ? 1 : 0);
  return s.subspan(begin, len);
}

}  // namespace tessera
