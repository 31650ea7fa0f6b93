// fuzz_dataset: the bytes as an HDF5 dataset file, read as `tessera train` reads its data:
// io::open_split on MPI_COMM_SELF of split /train (a supervised split, or a token split with
// context 4: the file decides), every sample (up to a cap) read back in small batches, uncached
// and, where the split is small, cached; both reads must give the same values.
// docs/robustness.md.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "fuzz_target.hpp"
#include "io/dataset.hpp"

namespace {

using namespace tessera;

constexpr std::string_view kTarget = "fuzz_dataset";
constexpr std::int64_t kContext = 4;
// Caps on the target's own reads (what a split claims can be far larger than the input).
constexpr std::int64_t kMaxSamples = 48;              // read samples [0, 48) and the last one
constexpr std::int64_t kMaxRowValues = 1 << 16;       // values per sample (inputs, labels, targets)
constexpr std::int64_t kMaxCachedValues = 1 << 22;    // the whole split, cached
constexpr std::size_t kBatch = 5;

// What reading a split gave.
struct Values {
  std::vector<float> inputs, targets;
  std::vector<std::int32_t> labels;

  bool operator==(const Values& o) const {
    const auto same = [](const auto& a, const auto& b) {
      return a.size() == b.size() &&
             (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(a[0])) == 0);
    };
    return same(inputs, o.inputs) && same(targets, o.targets) && same(labels, o.labels);
  }
};

std::int64_t row_values(const io::SplitInfo& info) {
  return std::max({info.features, info.has_labels ? info.label_width : info.target_width,
                   std::int64_t{1}});
}

// The samples read: the first kMaxSamples and the last, in batches whose indices go down and
// repeat one, as a shuffled global batch may.
std::vector<std::int64_t> sample_order(std::int64_t samples) {
  std::vector<std::int64_t> order;
  const std::int64_t n = std::min(samples, kMaxSamples);
  for (std::int64_t i = n - 1; i >= 0; --i) order.push_back(i);
  if (samples > n) order.push_back(samples - 1);
  if (!order.empty()) order.push_back(order.front());
  return order;
}

Values read_samples(io::Split& split) {
  const io::SplitInfo& info = split.info();
  if (info.samples < 1 || info.features < 1)
    fuzz::finding(kTarget, "a split opened with " + std::to_string(info.samples) + " samples of " +
                               std::to_string(info.features) + " features");
  Values v;
  if (row_values(info) > kMaxRowValues) return v;
  const auto features = static_cast<std::size_t>(info.features);
  const auto label_width = static_cast<std::size_t>(info.label_width);
  const auto target_width = static_cast<std::size_t>(info.target_width);
  const std::vector<std::int64_t> order = sample_order(info.samples);
  v.inputs.resize(order.size() * features);
  if (info.has_labels) v.labels.resize(order.size() * label_width);
  else v.targets.resize(order.size() * target_width);
  for (std::size_t first = 0; first < order.size(); first += kBatch) {
    const std::size_t n = std::min(kBatch, order.size() - first);
    split.read(std::span<const std::int64_t>(order.data() + first, n), v.inputs.data() + first * features,
               info.has_labels ? v.labels.data() + first * label_width : nullptr,
               info.has_labels ? nullptr : v.targets.data() + first * target_width);
  }
  split.read({}, nullptr, nullptr, nullptr);  // a rank with no samples in a batch
  return v;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  fuzz::start(argc, argv, false);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const fuzz::TempFile file(data, size, ".h5");
  Values uncached;
  std::int64_t values = 0;
  const bool opened = fuzz::expect_input_errors_only(kTarget, "open_split uncached", [&] {
    const std::unique_ptr<io::Split> split = io::open_split(MPI_COMM_SELF, file.path(), "train", kContext, false);
    const io::SplitInfo& info = split->info();
    if (__builtin_mul_overflow(info.samples, row_values(info), &values)) values = kMaxCachedValues + 1;
    uncached = read_samples(*split);
  });
  if (!opened || values > kMaxCachedValues) return 0;
  fuzz::expect_input_errors_only(kTarget, "open_split cached", [&] {
    const std::unique_ptr<io::Split> split = io::open_split(MPI_COMM_SELF, file.path(), "train", kContext, true);
    if (!(read_samples(*split) == uncached))
      fuzz::finding(kTarget, "the cached split reads other values than the uncached one");
  });
  return 0;
}
