// SupervisedSplit on 1, 2 and 4 ranks: rows read collectively (and from the cache) equal the
// values written, for every input and answer type; malformed files fail on every rank with the
// dataset named; and the time of one training-step read on Fashion-MNIST.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "dataset_test_util.hpp"
#include "mpi_test_util.hpp"
#include "io/dataset.hpp"
#include "io/dataset_writer.hpp"
#include "io/prepare.hpp"

namespace fs = std::filesystem;
namespace io = tessera::io;
using tessera::InputError;

using tessera::test::expect_input_error;
using tessera::test::DatasetFileTest;
using tessera::test::world_rank;

namespace {

constexpr std::int64_t kRows = 37;
constexpr int kTrials = 40;

std::uint8_t u8_input(std::int64_t i, std::int64_t k) { return static_cast<std::uint8_t>(i * 13 + k * 5); }
float f32_input(std::int64_t i, std::int64_t k) { return 0.5f * static_cast<float>(i) - static_cast<float>(k); }
std::int16_t label_of(std::int64_t i) { return static_cast<std::int16_t>((i * 7) % 5); }
float target_of(std::int64_t i, std::int64_t k) { return static_cast<float>(i) + 0.25f * static_cast<float>(k); }

template <class T, class F>
std::vector<T> table(std::int64_t rows, std::int64_t cols, F value) {
  std::vector<T> out;
  for (std::int64_t i = 0; i < rows; ++i)
    for (std::int64_t k = 0; k < cols; ++k) out.push_back(value(i, k));
  return out;
}

void write_u8_inputs(io::DatasetWriter& out, const std::string& split, std::int64_t rows = kRows) {
  const std::string name = "/" + split + "/inputs";
  out.write(name, {std::uint64_t(rows), 3, 4}, std::span<const std::uint8_t>(table<std::uint8_t>(rows, 12, u8_input)));
  out.write_float_attr(name, "scale", 0.5f);
  out.write_float_attr(name, "offset", -1.0f);
}

void write_labels(io::DatasetWriter& out, const std::string& split, std::int64_t rows = kRows) {
  std::vector<std::int16_t> labels;
  for (std::int64_t i = 0; i < rows; ++i) labels.push_back(label_of(i));
  out.write("/" + split + "/labels", {std::uint64_t(rows)}, std::span<const std::int16_t>(labels));
}

// Index sets that differ per rank and per trial, some empty, with duplicates and runs.
std::vector<std::int64_t> indices_for(int rank, int trial) {
  if ((rank + trial) % 3 == 2) return {};
  if (trial == 0) return {5, 6, 7, 7, 0, kRows - 1, 6};
  std::mt19937 rng(static_cast<unsigned>(rank * 1000 + trial));
  std::vector<std::int64_t> out(rng() % 25 + 1);
  for (auto& index : out) index = static_cast<std::int64_t>(rng() % kRows);
  return out;
}

// Every test writes into a directory of its own, removed after it on every rank.
class DatasetIo : public DatasetFileTest {};

}  // namespace

TEST_F(DatasetIo, Uint8InputsWithLabelsMatchWhatWasWritten) {
  const std::string path = make_file("u8_labels.h5", [](io::DatasetWriter& out) {
    write_u8_inputs(out, "train");
    write_labels(out, "train");
  });
  std::vector<std::int64_t> last_rows;
  std::vector<float> last_x;
  for (bool cache : {false, true}) {
    io::SupervisedSplit split(MPI_COMM_WORLD, path, "train", cache);
    const io::SplitInfo& info = split.info();
    ASSERT_EQ(info.samples, kRows);
    ASSERT_EQ(info.features, 12);
    EXPECT_EQ(info.sample_shape, (std::vector<std::int64_t>{3, 4}));
    EXPECT_TRUE(info.has_labels);
    EXPECT_EQ(info.classes, 5);  // max label + 1: no attribute
    EXPECT_EQ(info.scale, 0.5f);
    EXPECT_EQ(info.offset, -1.0f);
    // No fatal assertion inside the loop: a rank that left early would hang the others.
    int wrong = 0;
    for (int trial = 0; trial < kTrials; ++trial) {
      std::vector<std::int64_t> rows = indices_for(world_rank(), trial);
      std::vector<float> x(rows.size() * 12, -99.0f);
      std::vector<std::int32_t> y(rows.size(), -99);
      split.read(rows, x.data(), y.data(), nullptr);
      for (std::size_t i = 0; i < rows.size(); ++i) {
        EXPECT_EQ(y[i], label_of(rows[i])) << "cache " << cache << " sample " << rows[i];
        for (std::int64_t k = 0; k < 12; ++k)
          wrong += x[i * 12 + k] != float(u8_input(rows[i], k)) * 0.5f - 1.0f;
      }
    }
    EXPECT_EQ(wrong, 0) << "rank " << world_rank() << " cache " << cache << ": input values differ";
  }
}

TEST_F(DatasetIo, Float32InputsWithTargetsMatchWhatWasWritten) {
  const std::string path = make_file("f32_targets.h5", [](io::DatasetWriter& out) {
    out.write("/test/inputs", {kRows, 6}, std::span<const float>(table<float>(kRows, 6, f32_input)));
    out.write("/test/targets", {kRows, 2}, std::span<const float>(table<float>(kRows, 2, target_of)));
  });
  for (bool cache : {false, true}) {
    io::SupervisedSplit split(MPI_COMM_WORLD, path, "test", cache);
    ASSERT_FALSE(split.info().has_labels);
    ASSERT_EQ(split.info().target_width, 2);
    EXPECT_EQ(split.info().scale, 1.0f);
    int wrong = 0;
    for (int trial = 0; trial < kTrials; ++trial) {
      std::vector<std::int64_t> rows = indices_for(world_rank(), trial);
      std::vector<float> x(rows.size() * 6), t(rows.size() * 2);
      split.read(rows, x.data(), nullptr, t.data());
      for (std::size_t i = 0; i < rows.size(); ++i) {
        for (std::int64_t k = 0; k < 6; ++k) wrong += x[i * 6 + k] != f32_input(rows[i], k);
        for (std::int64_t k = 0; k < 2; ++k) wrong += t[i * 2 + k] != target_of(rows[i], k);
      }
    }
    EXPECT_EQ(wrong, 0) << "rank " << world_rank() << " cache " << cache << ": values differ";
  }
}

TEST_F(DatasetIo, ClassesAttributeWins) {
  const std::string path = make_file("classes.h5", [](io::DatasetWriter& out) {
    write_u8_inputs(out, "train");
    write_labels(out, "train");
    out.write_attr("/train/labels", "classes", std::int64_t{10});
  });
  io::SupervisedSplit split(MPI_COMM_WORLD, path, "train", false);
  EXPECT_EQ(split.info().classes, 10);
}

TEST_F(DatasetIo, MalformedFilesFailOnEveryRankNamingTheDataset) {
  const std::string good = make_file("good.h5", [](io::DatasetWriter& out) {
    write_u8_inputs(out, "train");
    write_labels(out, "train");
  });
  expect_input_error([&] { io::SupervisedSplit(MPI_COMM_WORLD, good, "test", false); },
                     {good, "no group /test"});

  const std::string no_labels = make_file("no_labels.h5", [](io::DatasetWriter& out) { write_u8_inputs(out, "train"); });
  expect_input_error([&] { io::SupervisedSplit(MPI_COMM_WORLD, no_labels, "train", false); },
                     {no_labels, "/train/labels", "/train/targets"});

  const std::string short_labels = make_file("short_labels.h5", [](io::DatasetWriter& out) {
    write_u8_inputs(out, "train");
    write_labels(out, "train", kRows - 1);
  });
  expect_input_error([&] { io::SupervisedSplit(MPI_COMM_WORLD, short_labels, "train", true); },
                     {short_labels + ": dataset /train/labels has 36 rows but /train/inputs has 37"});

  const std::string int16_inputs = make_file("int16_inputs.h5", [](io::DatasetWriter& out) {
    out.write("/train/inputs", {kRows, 2}, std::span<const std::int16_t>(std::vector<std::int16_t>(kRows * 2)));
    write_labels(out, "train");
  });
  expect_input_error([&] { io::SupervisedSplit(MPI_COMM_WORLD, int16_inputs, "train", false); },
                     {int16_inputs, "/train/inputs has type int16, expected uint8 or float32"});

  const std::string float_labels = make_file("float_labels.h5", [](io::DatasetWriter& out) {
    write_u8_inputs(out, "train");
    out.write("/train/labels", {kRows}, std::span<const float>(std::vector<float>(kRows)));
  });
  expect_input_error([&] { io::SupervisedSplit(MPI_COMM_WORLD, float_labels, "train", false); },
                     {float_labels, "/train/labels has type float32, expected an integer type"});

  const std::string bad_label = make_file("bad_label.h5", [](io::DatasetWriter& out) {
    write_u8_inputs(out, "train");
    std::vector<std::int16_t> labels(kRows, 1);
    labels[kRows - 2] = 9;
    out.write("/train/labels", {kRows}, std::span<const std::int16_t>(labels));
    out.write_attr("/train/labels", "classes", std::int64_t{5});
  });
  expect_input_error([&] { io::SupervisedSplit(MPI_COMM_WORLD, bad_label, "train", false); },
                     {bad_label, "/train/labels", "sample 35 has label 9", "< 5"});

  const std::string text = dir() + "/not_hdf5.h5";
  if (world_rank() == 0) std::ofstream(text) << "just text\n";
  MPI_Barrier(MPI_COMM_WORLD);
  expect_input_error([&] { io::SupervisedSplit(MPI_COMM_WORLD, text, "train", false); },
                     {text, "not an HDF5 file"});
  const std::string missing = dir() + "/absent.h5";
  expect_input_error([&] { io::SupervisedSplit(MPI_COMM_WORLD, missing, "train", false); },
                     {missing, "no such file"});
}

// The read of one training step: 64 random rows per rank of Fashion-MNIST's training split.
TEST_F(DatasetIo, FashionMnistReadOf64RandomRows) {
  const char* source = "/usr/share/datasets/fashion-mnist";
  if (!fs::exists(source)) GTEST_SKIP() << source << " is missing (installed by the project's setup)";
  const std::string path = dir() + "/fashion-mnist.h5";
  if (world_rank() == 0) io::prepare_fashion_mnist(source, path);
  MPI_Barrier(MPI_COMM_WORLD);
  int ranks = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &ranks);

  std::vector<std::int64_t> last_rows;
  std::vector<float> last_x;
  for (bool cache : {false, true}) {
    io::SupervisedSplit split(MPI_COMM_WORLD, path, "train", cache);
    std::mt19937_64 rng(static_cast<unsigned>(world_rank()));
    std::vector<std::int64_t> rows(64);
    std::vector<float> x(64 * 784);
    std::vector<std::int32_t> y(64);
    constexpr int kWarmup = 5, kSteps = 200;
    double start = 0.0;
    for (int step = 0; step < kWarmup + kSteps; ++step) {
      if (step == kWarmup) {
        MPI_Barrier(MPI_COMM_WORLD);
        start = MPI_Wtime();
      }
      for (auto& r : rows) r = static_cast<std::int64_t>(rng() % 60000);
      split.read(rows, x.data(), y.data(), nullptr);
    }
    double mine = (MPI_Wtime() - start) / kSteps, slowest = 0.0;
    MPI_Allreduce(&mine, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    if (world_rank() == 0) {
      std::printf("[ timing   ] SupervisedSplit::read, 64 random rows of 784 B per rank, %d rank(s), "
                  "cache %s: %.1f us per call (slowest rank)\n", ranks, cache ? "on " : "off",
                  slowest * 1e6);
    }
    for (std::int32_t label : y) EXPECT_TRUE(label >= 0 && label < 10);
    // The timing is information, not an assertion; what is asserted is that both paths agree:
    // the cached split returns the rows the streaming one read last.
    if (cache) {
      std::vector<float> again(64 * 784);
      split.read(last_rows, again.data(), y.data(), nullptr);
      EXPECT_EQ(again, last_x);
    } else {
      last_rows = rows;
      last_x = x;
    }
  }
}
