// The distributed sampler: global batch k holds the same samples whatever the rank and
// micro-batch split; each epoch's order is a permutation and a pure function of (seed, epoch).
#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "train/sampler.hpp"

namespace tessera {
namespace {

TEST(Sampler, EpochOrderIsAPermutationAndAFunctionOfSeedAndEpoch) {
  Sampler a(1000, 42, 64, true), b(1000, 42, 64, true), c(1000, 43, 64, true);
  auto p0 = a.permutation(0);
  std::vector<std::int64_t> sorted = p0;
  std::sort(sorted.begin(), sorted.end());
  for (std::int64_t i = 0; i < 1000; ++i) ASSERT_EQ(sorted[static_cast<std::size_t>(i)], i);
  EXPECT_EQ(p0, b.permutation(0));
  (void)b.permutation(3);  // the cache must not change epoch 0's answer
  EXPECT_EQ(p0, b.permutation(0));
  EXPECT_NE(p0, a.permutation(1));
  EXPECT_NE(p0, c.permutation(0));
  // Not the identity, and not trivially reversed.
  int fixed = 0;
  for (std::int64_t i = 0; i < 1000; ++i) fixed += p0[static_cast<std::size_t>(i)] == i;
  EXPECT_LT(fixed, 20);
}

TEST(Sampler, GlobalBatchIsTheSameSamplesForAnyRankAndMicroBatchSplit) {
  Sampler s(1000, 7, 96, true);
  for (std::int64_t k : {0, 3, 9}) {
    const auto batch = s.global_batch(2, k);
    const std::set<std::int64_t> whole(batch.begin(), batch.end());
    ASSERT_EQ(whole.size(), 96u);
    for (int ranks : {1, 2, 3, 4, 8}) {
      for (int micro : {1, 2, 4}) {
        std::vector<std::int64_t> joined;
        for (int r = 0; r < ranks; ++r) {
          const auto local = Sampler::part(batch, r, ranks);
          for (int m = 0; m < micro; ++m) {
            const auto mb = Sampler::part(local, m, micro);
            joined.insert(joined.end(), mb.begin(), mb.end());
          }
        }
        // Concatenated in rank-then-micro-batch order, the parts are the batch itself.
        EXPECT_TRUE(std::equal(joined.begin(), joined.end(), batch.begin(), batch.end()))
            << ranks << " ranks, " << micro << " micro-batches";
      }
    }
  }
}

TEST(Sampler, PartsAreContiguousAndNearlyEqual) {
  std::vector<std::int64_t> v(10);
  for (int i = 0; i < 10; ++i) v[static_cast<std::size_t>(i)] = i;
  const std::vector<std::size_t> sizes = {3, 3, 2, 2};
  std::int64_t next = 0;
  for (int r = 0; r < 4; ++r) {
    const auto p = Sampler::part(v, r, 4);
    ASSERT_EQ(p.size(), sizes[static_cast<std::size_t>(r)]);
    for (auto x : p) EXPECT_EQ(x, next++);
  }
  EXPECT_TRUE(Sampler::part(std::span<const std::int64_t>(v).first(2), 3, 4).empty());
}

TEST(Sampler, LastPartialBatchIsDroppedOrKept) {
  Sampler drop(1000, 1, 64, true), keep(1000, 1, 64, false);
  EXPECT_EQ(drop.batches_per_epoch(), 15);
  EXPECT_EQ(keep.batches_per_epoch(), 16);
  EXPECT_EQ(keep.global_batch(0, 15).size(), 1000u - 15 * 64);
  EXPECT_THROW(drop.global_batch(0, 15), std::out_of_range);
  // Every sample once per epoch when the partial batch is kept.
  std::set<std::int64_t> seen;
  for (std::int64_t k = 0; k < 16; ++k)
    for (auto i : keep.global_batch(4, k)) seen.insert(i);
  EXPECT_EQ(seen.size(), 1000u);
}

}  // namespace
}  // namespace tessera
