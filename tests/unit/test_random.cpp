// Counter-based random numbers and the initialisation they drive: pure functions of
// (seed, name, index), independent of everything else in the model.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "kernel_test_util.hpp"
#include "kernels/precision.hpp"
#include "kernels/random.hpp"
#include "nn/linear.hpp"
#include "nn/param_store.hpp"

namespace {

using namespace tessera;
using kernels::hash_name;
using kernels::normal;
using kernels::uniform01;
using tessera::test::to_host;

TEST(Random, HashNameIsFnv1a64) {
  EXPECT_EQ(hash_name(""), 0xcbf29ce484222325ULL);
  EXPECT_EQ(hash_name("a"), 0xaf63dc4c8601ec8cULL);
  EXPECT_EQ(hash_name("foobar"), 0x85944171f73967e8ULL);
  EXPECT_NE(hash_name("layers.0.weight"), hash_name("layers.0.bias"));
  EXPECT_NE(hash_name("layers.1.weight"), hash_name("layers.0.weight"));
}

TEST(Random, SameCountersGiveSameValue) {
  for (std::uint64_t i = 0; i < 1000; ++i) {
    EXPECT_EQ(uniform01(42, 7, i), uniform01(42, 7, i));
    EXPECT_EQ(normal(42, 7, i), normal(42, 7, i));
  }
  // Each coordinate of the counter matters.
  EXPECT_NE(uniform01(42, 7, 0), uniform01(43, 7, 0));
  EXPECT_NE(uniform01(42, 7, 0), uniform01(42, 8, 0));
  EXPECT_NE(uniform01(42, 7, 0), uniform01(42, 7, 1));
}

TEST(Random, UniformMomentsOverAMillionDraws) {
  const std::uint64_t n = 1000000, seed = 1234, stream = hash_name("test.uniform");
  double sum = 0, sum_sq = 0, lo = 1, hi = 0;
  for (std::uint64_t i = 0; i < n; ++i) {
    const double u = uniform01(seed, stream, i);
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
    sum += u;
    sum_sq += u * u;
    lo = std::min(lo, u);
    hi = std::max(hi, u);
  }
  const double mean = sum / n, var = sum_sq / n - mean * mean;
  EXPECT_NEAR(mean, 0.5, 2e-3);         // sd of the mean: 2.9e-4
  EXPECT_NEAR(var, 1.0 / 12.0, 1e-3);
  EXPECT_LT(lo, 1e-4);
  EXPECT_GT(hi, 1 - 1e-4);
  // Successive indices are not correlated (lag-1 autocorrelation).
  double cov = 0;
  for (std::uint64_t i = 0; i + 1 < n; ++i)
    cov += (uniform01(seed, stream, i) - 0.5) * (uniform01(seed, stream, i + 1) - 0.5);
  EXPECT_NEAR(cov / (n - 1) * 12.0, 0.0, 6e-3);
}

TEST(Random, NormalMomentsOverAMillionDraws) {
  const std::uint64_t n = 1000000, seed = 99, stream = hash_name("test.normal");
  double sum = 0, sum_sq = 0, sum_4 = 0;
  for (std::uint64_t i = 0; i < n; ++i) {
    const double z = normal(seed, stream, i);
    ASSERT_TRUE(std::isfinite(z));
    sum += z;
    sum_sq += z * z;
    sum_4 += z * z * z * z;
  }
  const double mean = sum / n, var = sum_sq / n - mean * mean;
  EXPECT_NEAR(mean, 0.0, 5e-3);
  EXPECT_NEAR(var, 1.0, 1e-2);
  EXPECT_NEAR(sum_4 / n, 3.0, 5e-2);  // kurtosis of a Gaussian
}

TEST(Random, DifferentNamesGiveUncorrelatedStreams) {
  const std::uint64_t a = hash_name("layers.0.weight"), b = hash_name("layers.0.bias");
  const int n = 100000;
  double cov = 0;
  int equal = 0;
  for (int i = 0; i < n; ++i) {
    const double u = uniform01(5, a, i), v = uniform01(5, b, i);
    equal += u == v;
    cov += (u - 0.5) * (v - 0.5);
  }
  EXPECT_EQ(equal, 0);
  EXPECT_NEAR(cov / n * 12.0, 0.0, 2e-2);
}

// --- ParamStore initialisation ---------------------------------------------------------------

TEST(ParamStore, ValuesDependOnlyOnSeedNameAndIndex) {
  const ExecSpace exec;
  nn::ParamStore<double> alone;
  alone.add("shared", {3, 5}, nn::InitKind::uniform, 0.5);
  alone.allocate();
  alone.initialize(exec, 7);

  // The same parameter after others, of other kinds, in another order.
  nn::ParamStore<double> crowded;
  crowded.add("first", {7}, nn::InitKind::normal, 1.0);
  crowded.add("ones", {2, 2}, nn::InitKind::ones);
  crowded.add("shared", {3, 5}, nn::InitKind::uniform, 0.5);
  crowded.add("last", {33}, nn::InitKind::uniform, 2.0);
  crowded.allocate();
  crowded.initialize(exec, 7);

  const auto x = to_host(alone.value(0)), y = to_host(crowded.value(crowded.find("shared")));
  ASSERT_EQ(x.size(), 15u);
  EXPECT_EQ(x, y);
  // And the value is the documented function of the counters.
  for (std::size_t j = 0; j < x.size(); ++j)
    EXPECT_EQ(x[j], 0.5 * (2 * uniform01(7, hash_name("shared"), j) - 1)) << j;

  // Another seed, other values.
  nn::ParamStore<double> reseeded;
  reseeded.add("shared", {3, 5}, nn::InitKind::uniform, 0.5);
  reseeded.allocate();
  reseeded.initialize(exec, 8);
  EXPECT_NE(to_host(reseeded.value(0)), x);

  // Float stores hold the same values, rounded.
  nn::ParamStore<float> single;
  single.add("shared", {3, 5}, nn::InitKind::uniform, 0.5);
  single.allocate();
  single.initialize(exec, 7);
  const auto f = to_host(single.value(0));
  for (std::size_t j = 0; j < x.size(); ++j) EXPECT_EQ(f[j], float(x[j]));
}

// The bf16 copies the products of a bf16 step read: each parameter's values rounded to bf16,
// made at the first use after a change and kept (not remade) until values_changed() says so.
TEST(ParamStore, Bf16CopiesFollowTheValuesVersion) {
  const ExecSpace exec;
  nn::ParamStore<float> store;
  const auto w = store.add("w", {5, 7}, nn::InitKind::normal, 1.0);
  const auto v = store.add("v", {3}, nn::InitKind::uniform, 2.0);
  store.allocate();
  store.initialize(exec, 3);
  const auto bits = [&](std::size_t i) {
    const Kokkos::View<const std::uint16_t*, MemSpace, Kokkos::MemoryUnmanaged> d(store.bf16_value(exec, i),
                                                                                 store.infos()[i].size);
    const auto h = Kokkos::create_mirror_view_and_copy(HostSpace(), d);
    return std::vector<std::uint16_t>(h.data(), h.data() + h.size());
  };
  const auto rounded = [&](std::size_t i) {
    std::vector<std::uint16_t> out;
    for (float x : to_host(store.value(i))) out.push_back(kernels::to_bf16_bits(x));
    return out;
  };
  EXPECT_EQ(bits(w), rounded(w));
  EXPECT_EQ(bits(v), rounded(v));
  const std::vector<std::uint16_t> before = bits(w);
  Kokkos::deep_copy(store.value(w), 0.25f);  // a write that says nothing: the copy is kept
  EXPECT_EQ(bits(w), before);
  const auto version = store.values_version();
  store.values_changed();
  EXPECT_GT(store.values_version(), version);
  EXPECT_EQ(bits(w), std::vector<std::uint16_t>(35, kernels::to_bf16_bits(0.25f)));
  store.initialize(exec, 4);  // initialize() says it itself
  EXPECT_EQ(bits(w), rounded(w));
  EXPECT_NE(bits(w), before);
  nn::ParamStore<double> wide;
  wide.add("w", {2}, nn::InitKind::ones);
  wide.allocate();
  EXPECT_THROW(wide.bf16_value(exec, 0), std::logic_error);
}

TEST(ParamStore, LayoutPaddingAndKinds) {
  nn::ParamStore<double> store;
  const auto a = store.add("a", {3}, nn::InitKind::ones);
  const auto b = store.add("b", {17}, nn::InitKind::zeros);
  const auto c = store.add("c", {1000}, nn::InitKind::normal, 0.1);
  EXPECT_THROW(store.add("a", {1}, nn::InitKind::ones), std::logic_error);
  store.allocate();
  EXPECT_THROW(store.add("d", {1}, nn::InitKind::ones), std::logic_error);
  store.initialize(ExecSpace(), 1);
  const auto& infos = store.infos();
  EXPECT_EQ(infos[a].offset, 0u);
  EXPECT_EQ(infos[b].offset, 16u);
  EXPECT_EQ(infos[c].offset, 48u);
  EXPECT_EQ(store.size(), 48u + 1008u);
  EXPECT_EQ(store.parameter_count(), 1020u);
  const auto all = to_host(store.values());
  for (std::size_t i = 0; i < all.size(); ++i) {
    const bool in_a = i < 3, in_b = i >= 16 && i < 33, in_c = i >= 48 && i < 1048;
    if (in_a) {
      EXPECT_EQ(all[i], 1.0);
    } else if (!in_c) {
      EXPECT_EQ(all[i], 0.0) << "padding or zeros at " << i << (in_b ? " (b)" : "");
    }
  }
  double sum_sq = 0;
  for (const double v : to_host(store.value(c))) sum_sq += v * v;
  EXPECT_NEAR(std::sqrt(sum_sq / 1000), 0.1, 0.01);
  EXPECT_THROW(store.find("nope"), std::out_of_range);
  EXPECT_THROW(store.value_matrix(a), std::logic_error);
}

TEST(ParamStore, BucketsFillFromTheLastUnitAndSplitIntoEqualChunks) {
  // Units of 100, 40 and 30 elements (padded: 112, 48, 32); buckets of at least 64 elements
  // filled backwards: {unit 2, unit 1} then {unit 0}; three shards.
  nn::ParamStore<double> store;
  for (const auto& [name, n] : std::vector<std::pair<std::string, std::int64_t>>{{"u0", 100}, {"u1", 40}, {"u2", 30}}) {
    store.begin_unit();
    store.add(name + ".w", {n}, nn::InitKind::uniform, 1.0);
  }
  store.begin_unit();  // a trailing unit without parameters is no unit
  store.plan(3, 64);
  ASSERT_EQ(store.units(), 3u);
  ASSERT_EQ(store.buckets().size(), 2u);
  const auto& b0 = store.buckets()[0];
  const auto& b1 = store.buckets()[1];
  EXPECT_EQ(b0.first_unit, 0u);
  EXPECT_EQ(b0.last_unit, 0u);
  EXPECT_EQ(b1.first_unit, 1u);
  EXPECT_EQ(b1.last_unit, 2u);
  EXPECT_EQ(b0.offset, 0u);
  EXPECT_EQ(b0.length % (16 * 3), 0u);
  EXPECT_GE(b0.length, 112u);
  EXPECT_EQ(b1.offset, b0.length);
  EXPECT_EQ(b1.length % (16 * 3), 0u);
  EXPECT_EQ(b0.chunk * 3, b0.length);
  EXPECT_EQ(b1.shard_offset, b0.chunk);
  EXPECT_EQ(store.shard_size(), b0.chunk + b1.chunk);
  EXPECT_EQ(store.bucket_of_unit(2), 1u);

  // Without full values a bucket's views need attached memory; a shard initialises as the
  // matching part of the full buffer would.
  store.allocate(nn::Storage{false, true});
  EXPECT_THROW(store.value(0), std::logic_error);
  tessera::Vector<double> full("full", store.size());
  store.initialize_range(ExecSpace(), 5, 0, store.size(), full.data());
  tessera::Vector<double> part("part", b1.chunk);
  store.initialize_range(ExecSpace(), 5, b1.offset + b1.chunk, b1.offset + 2 * b1.chunk, part.data());
  const auto f = to_host(full), q = to_host(part);
  for (std::size_t j = 0; j < b1.chunk; ++j) EXPECT_EQ(q[j], f[b1.offset + b1.chunk + j]) << j;
  store.attach_values(1, full.data() + b1.offset);
  EXPECT_EQ(to_host(store.value(store.find("u2.w"))),
            std::vector<double>(f.begin() + store.infos()[2].offset, f.begin() + store.infos()[2].offset + 30));
  EXPECT_THROW(store.attach_grads(0, nullptr), std::logic_error);  // full gradients exist
}

TEST(ParamStore, BeginBucketStartsABucketThatNothingBeforeShares) {
  // Four units of 16 elements in one bucket of any size, but begin_bucket() before unit 2 (an
  // interleaved stage's second chunk): buckets {0, 1} and {2, 3}. The unit a network begins
  // right after begin_bucket() is the same unit.
  nn::ParamStore<double> store;
  for (const char* name : {"u0.w", "u1.w", "u2.w", "u3.w"}) {
    if (name[1] == '2') store.begin_bucket();
    store.begin_unit();
    store.add(name, {16}, nn::InitKind::zeros);
  }
  store.plan(1);
  ASSERT_EQ(store.units(), 4u);
  ASSERT_EQ(store.buckets().size(), 2u);
  EXPECT_EQ(store.buckets()[0].first_unit, 0u);
  EXPECT_EQ(store.buckets()[0].last_unit, 1u);
  EXPECT_EQ(store.buckets()[1].first_unit, 2u);
  EXPECT_EQ(store.buckets()[1].last_unit, 3u);
}

TEST(Linear, InitBoundsAreOneOverSqrtFanIn) {
  nn::ParamStore<float> store;
  const int in = 50, out = 40;
  nn::Linear<float> layer(store, "layers.0", in, out);
  store.allocate();
  store.initialize(ExecSpace(), 3);
  const double bound = 1.0 / std::sqrt(double(in));
  EXPECT_EQ(store.infos()[layer.weight_index()].name, "layers.0.weight");
  EXPECT_EQ(store.infos()[layer.weight_index()].shape, (std::vector<std::int64_t>{out, in}));
  EXPECT_EQ(store.infos()[layer.bias_index()].name, "layers.0.bias");
  for (const std::size_t p : {layer.weight_index(), layer.bias_index()}) {
    const auto v = to_host(store.value(p));
    double max_abs = 0, sum = 0;
    for (const float w : v) {
      EXPECT_LE(std::abs(w), bound);
      max_abs = std::max(max_abs, double(std::abs(w)));
      sum += w;
    }
    EXPECT_GT(max_abs, 0.9 * bound);  // spans the interval, not a narrower one
    EXPECT_NEAR(sum / v.size(), 0.0, 0.5 * bound);
  }
  // Weight and bias come from different streams.
  EXPECT_NE(to_host(store.value(layer.weight_index()))[0], to_host(store.value(layer.bias_index()))[0]);
}

}  // namespace
