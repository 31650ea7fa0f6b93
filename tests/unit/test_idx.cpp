// IDX reading and `prepare fashion-mnist`: good files parse, every kind of damage is an
// InputError naming the file, and the prepared HDF5 file holds the IDX bytes.
#include <gtest/gtest.h>
#include <mpi.h>
#include <unistd.h>
#include <zlib.h>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "io/dataset.hpp"
#include "io/idx.hpp"
#include "io/inspect.hpp"
#include "io/prepare.hpp"

namespace fs = std::filesystem;
using tessera::InputError;
namespace io = tessera::io;

namespace {

const char* kFashionDir = "/usr/share/datasets/fashion-mnist";

std::vector<std::uint8_t> idx_bytes(std::uint32_t magic, const std::vector<std::uint32_t>& dims,
                                    const std::vector<std::uint8_t>& payload) {
  std::vector<std::uint8_t> out;
  auto put = [&](std::uint32_t v) {
    for (int shift = 24; shift >= 0; shift -= 8) out.push_back(static_cast<std::uint8_t>(v >> shift));
  };
  put(magic);
  for (std::uint32_t d : dims) put(d);
  out.insert(out.end(), payload.begin(), payload.end());
  return out;
}

void write_file(const fs::path& path, const std::vector<std::uint8_t>& bytes) {
  if (path.extension() == ".gz") {
    gzFile f = gzopen(path.c_str(), "wb");
    ASSERT_NE(f, nullptr);
    ASSERT_EQ(gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size())),
              static_cast<int>(bytes.size()));
    gzclose(f);
  } else {
    std::ofstream(path, std::ios::binary)
        .write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  }
}

std::uint8_t pixel(std::size_t image, std::size_t k) { return static_cast<std::uint8_t>(image * 31 + k * 7); }

std::vector<std::uint8_t> images_file(std::uint32_t count, std::uint32_t rows = 28,
                                      std::uint32_t cols = 28, std::size_t extra = 0) {
  std::vector<std::uint8_t> payload;
  for (std::size_t i = 0; i < count; ++i)
    for (std::size_t k = 0; k < rows * cols; ++k) payload.push_back(pixel(i, k));
  payload.resize(payload.size() + extra, 0);
  return idx_bytes(0x803, {count, rows, cols}, payload);
}

// Asserts that f throws an InputError whose message contains every one of parts.
void expect_input_error(const std::function<void()>& f, const std::vector<std::string>& parts) {
  try {
    f();
    ADD_FAILURE() << "no InputError thrown";
  } catch (const InputError& e) {
    for (const std::string& part : parts) {
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos)
          << "message \"" << e.what() << "\" lacks \"" << part << "\"";
    }
  }
}

class Idx : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("tessera-idx-" + std::to_string(getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  fs::path dir_;
};

}  // namespace

TEST_F(Idx, GoodFilesParsePlainAndGzipped) {
  for (const std::string suffix : {"", ".gz"}) {
    write_file(path("img" + suffix), images_file(3));
    write_file(path("lab" + suffix), idx_bytes(0x801, {3}, {0, 9, 5}));
    io::LabeledImages set = io::read_labeled_images(path("img" + suffix), path("lab" + suffix), {});
    ASSERT_EQ(set.images.count, 3);
    EXPECT_EQ(set.images.rows, 28);
    EXPECT_EQ(set.images.cols, 28);
    ASSERT_EQ(set.images.pixels.size(), 3u * 784);
    EXPECT_EQ(set.images.pixels[2 * 784 + 100], pixel(2, 100));
    EXPECT_EQ(set.labels.labels, (std::vector<std::uint8_t>{0, 9, 5}));
  }
}

TEST_F(Idx, BadMagicNamesTheFile) {
  write_file(path("lab.gz"), idx_bytes(0x802, {2}, {1, 2}));
  expect_input_error([&] { io::read_idx_labels(path("lab.gz")); },
                     {path("lab.gz"), "magic number 0x00000802, expected 0x00000801"});
  write_file(path("img"), images_file(1));
  expect_input_error([&] { io::read_idx_labels(path("img")); }, {path("img"), "magic"});
}

TEST_F(Idx, TruncatedDataNamesTheFile) {
  write_file(path("lab.gz"), idx_bytes(0x801, {5}, {1, 2, 3, 4}));
  expect_input_error([&] { io::read_idx_labels(path("lab.gz")); },
                     {path("lab.gz"), "truncated: header says 5 labels, file holds 4"});
  std::vector<std::uint8_t> img = images_file(2);
  img.resize(img.size() - 1);
  write_file(path("img"), img);
  expect_input_error([&] { io::read_idx_images(path("img")); },
                     {path("img"), "truncated: header says 2 images, file holds 1"});
  write_file(path("short"), {0, 0, 8});
  expect_input_error([&] { io::read_idx_images(path("short")); }, {path("short"), "truncated"});
}

TEST_F(Idx, DamagedGzipNamesTheFile) {
  write_file(path("img.gz"), images_file(50));
  fs::resize_file(path("img.gz"), fs::file_size(path("img.gz")) / 2);
  expect_input_error([&] { io::read_idx_images(path("img.gz")); }, {path("img.gz")});
}

TEST_F(Idx, TrailingBytesNameTheFile) {
  write_file(path("img.gz"), images_file(2, 28, 28, 3));
  expect_input_error([&] { io::read_idx_images(path("img.gz")); },
                     {path("img.gz"), "3 trailing bytes after the 2 images"});
}

TEST_F(Idx, CountMismatchNamesBothFiles) {
  write_file(path("img"), images_file(3));
  write_file(path("lab"), idx_bytes(0x801, {2}, {1, 2}));
  expect_input_error([&] { io::read_labeled_images(path("img"), path("lab"), {}); },
                     {path("lab"), path("img"), "2 labels", "3 images"});
  write_file(path("lab3"), idx_bytes(0x801, {3}, {1, 2, 3}));
  expect_input_error([&] { io::read_labeled_images(path("img"), path("lab3"), {4, 28, 28, 10}); },
                     {path("img"), "expected 4"});
}

TEST_F(Idx, LabelOutOfRangeNamesTheFileAndSample) {
  write_file(path("img"), images_file(3));
  write_file(path("lab"), idx_bytes(0x801, {3}, {1, 10, 3}));
  expect_input_error([&] { io::read_labeled_images(path("img"), path("lab"), {}); },
                     {path("lab"), "label 10 at index 1, expected < 10"});
}

TEST_F(Idx, WrongImageSizeNamesTheFile) {
  write_file(path("img"), images_file(2, 28, 27));
  write_file(path("lab"), idx_bytes(0x801, {2}, {1, 2}));
  expect_input_error([&] { io::read_labeled_images(path("img"), path("lab"), {}); },
                     {path("img"), "28x27, expected 28x28"});
}

TEST_F(Idx, MissingFilesNameThemselves) {
  expect_input_error([&] { io::read_idx_images(path("absent")); }, {path("absent"), "cannot open"});
  expect_input_error([&] { io::prepare_fashion_mnist(path("nowhere"), path("out.h5")); },
                     {"train-images-idx3-ubyte.gz", "no such file"});
}

TEST_F(Idx, PrepareFashionMnistKeepsTheIdxBytes) {
  if (!fs::exists(kFashionDir)) {
    GTEST_SKIP() << kFashionDir << " is missing: install the Fashion-MNIST IDX files (project setup)";
  }
  const std::string out = path("data/fashion-mnist.h5");
  io::prepare_fashion_mnist(kFashionDir, out);
  ASSERT_TRUE(fs::exists(out));
  EXPECT_FALSE(fs::exists(out + ".tmp"));

  // Compare rows of the HDF5 file with the raw IDX bytes.
  io::IdxImages raw = io::read_idx_images(std::string(kFashionDir) + "/t10k-images-idx3-ubyte.gz");
  io::IdxLabels raw_labels = io::read_idx_labels(std::string(kFashionDir) + "/t10k-labels-idx1-ubyte.gz");
  io::SupervisedSplit test(MPI_COMM_SELF, out, "test", false);
  const io::SplitInfo& info = test.info();
  EXPECT_EQ(info.samples, 10000);
  EXPECT_EQ(info.sample_shape, (std::vector<std::int64_t>{28, 28}));
  EXPECT_EQ(info.features, 784);
  EXPECT_TRUE(info.has_labels);
  EXPECT_EQ(info.classes, 10);
  EXPECT_FLOAT_EQ(info.scale, 1.0f / 255.0f);
  EXPECT_EQ(info.offset, 0.0f);
  std::vector<std::int64_t> rows = {0, 1, 4321, 9999};
  std::vector<float> x(rows.size() * 784);
  std::vector<std::int32_t> y(rows.size());
  test.read(rows, x.data(), y.data(), nullptr);
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const auto r = static_cast<std::size_t>(rows[i]);
    EXPECT_EQ(y[i], raw_labels.labels[r]);
    for (std::size_t k = 0; k < 784; k += 13) {
      ASSERT_EQ(std::lround(x[i * 784 + k] * 255.0f), raw.pixels[r * 784 + k]) << "row " << r;
    }
  }
  io::SupervisedSplit train(MPI_COMM_SELF, out, "train", false);
  EXPECT_EQ(train.info().samples, 60000);

  // Attributes and shapes, as inspect prints them.
  std::ostringstream text;
  io::inspect_checkpoint(out, text);
  for (const char* part : {"source  fashion-mnist", "format  tessera-dataset",
                           "train/inputs  [60000,28,28]  uint8", "test/labels   [10000]        uint8"}) {
    EXPECT_NE(text.str().find(part), std::string::npos) << "inspect output lacks " << part << ":\n"
                                                        << text.str();
  }
}
