// Checkpoints on 1, 2 and 4 ranks: tensors written by row blocks (some ranks writing nothing)
// read back exactly under another split, attributes round-trip, the temporary file is gone,
// non-checkpoints and missing datasets are InputErrors, and h5py can read the file.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdlib>
#include <filesystem>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "mpi_test_util.hpp"
#include "io/checkpoint_file.hpp"
#include "io/dataset_writer.hpp"
#include "io/inspect.hpp"

namespace fs = std::filesystem;
namespace io = tessera::io;
using tessera::InputError;

using tessera::test::expect_input_error;
using tessera::test::SharedTempDirTest;
using tessera::test::world_rank;
using tessera::test::world_size;

namespace {

// Element values no layout can fake: a function of tensor id and flat index.
float value(int tensor, std::uint64_t flat) { return static_cast<float>(tensor) * 1000.0f + 0.5f * static_cast<float>(flat); }

struct Tensor {
  std::string path;
  std::vector<std::uint64_t> shape;
};

const std::vector<Tensor> kTensors = {
    {"model/layers.0.weight", {13, 5}},
    {"model/layers.0.bias", {13}},
    {"model/layers.1.bias", {2}},  // fewer rows than ranks: some ranks write nothing
    {"optimizer/layers.0.weight/momentum", {13, 5}},
    {"train/loss_scale", {1}},
};

// Rows [first, first + count) of `rows` owned by `part` of `parts` (block split; `skew` moves the
// boundaries so that reading uses another split than writing).
std::pair<std::uint64_t, std::uint64_t> block(std::uint64_t rows, int part, int parts, int skew) {
  auto edge = [&](int p) {
    if (p == 0) return std::uint64_t{0};
    if (p == parts) return rows;
    return std::min<std::uint64_t>(rows, rows * static_cast<std::uint64_t>(p) / static_cast<std::uint64_t>(parts) + skew);
  };
  return {edge(part), edge(part + 1) - edge(part)};
}

std::uint64_t row_size(const Tensor& t) {
  std::uint64_t n = 1;
  for (std::size_t d = 1; d < t.shape.size(); ++d) n *= t.shape[d];
  return n;
}

const std::string kDeck = "[run]\nseed = 7\n\n[model]\nhidden = [512, 512]\n";

// Writes the test checkpoint as dir/checkpoints/name. Collective.
std::string write_test_checkpoint(const std::string& dir, const std::string& name) {
  io::CheckpointContent content;
  content.root_attrs = {{"step", std::int64_t{1200}}, {"seed", std::int64_t{-7}},
                        {"layout", std::string("dp=2,tp=1,pp=1,zero=0")}, {"deck", kDeck},
                        {"lr", 0.125}};
  content.group_attrs = {{"optimizer", {{"kind", std::string("sgd")}, {"step", std::int64_t{1200}}}},
                         {"train", {{"loss_scale", 65536.0}}}};
  std::vector<std::vector<float>> data(kTensors.size());
  for (std::size_t id = 0; id < kTensors.size(); ++id) {
    const Tensor& t = kTensors[id];
    auto [first, rows] = block(t.shape[0], world_rank(), world_size(), 0);
    const std::uint64_t width = row_size(t);
    for (std::uint64_t k = 0; k < rows * width; ++k) data[id].push_back(value(int(id), first * width + k));
    io::TensorSlab slab{t.path, t.shape, std::vector<std::uint64_t>(t.shape.size(), 0), t.shape,
                        data[id].data()};
    slab.offset[0] = first;
    slab.count[0] = rows;
    content.tensors.push_back(slab);
  }
  const std::string path = dir + "/checkpoints/" + name;
  io::write_checkpoint(MPI_COMM_WORLD, path, content);
  return path;
}

// Every test writes into a directory of its own, removed after it on every rank.
class CheckpointIo : public SharedTempDirTest {};

}  // namespace

TEST_F(CheckpointIo, TensorsReadBackExactlyUnderAnotherSplit) {
  const std::string path = write_test_checkpoint(dir(), "step_00001200.h5");
  EXPECT_TRUE(fs::exists(path));
  EXPECT_FALSE(fs::exists(path + ".tmp"));

  io::CheckpointFile file(MPI_COMM_WORLD, path);
  std::vector<std::string> expected;
  for (const Tensor& t : kTensors) expected.push_back(t.path);
  std::sort(expected.begin(), expected.end());
  EXPECT_EQ(file.list(""), expected);
  EXPECT_EQ(file.list("model"), (std::vector<std::string>{"model/layers.0.bias", "model/layers.0.weight",
                                                          "model/layers.1.bias"}));
  EXPECT_TRUE(file.list("absent").empty());

  // Read with the rank order reversed and the boundaries moved.
  int wrong = 0;
  for (std::size_t id = 0; id < kTensors.size(); ++id) {
    const Tensor& t = kTensors[id];
    EXPECT_EQ(file.shape(t.path), t.shape);
    auto [first, rows] = block(t.shape[0], world_size() - 1 - world_rank(), world_size(), 1);
    std::vector<std::uint64_t> offset(t.shape.size(), 0), count = t.shape;
    offset[0] = first;
    count[0] = rows;
    const std::uint64_t width = row_size(t);
    std::vector<float> out(rows * width, -1.0f);
    file.read(t.path, offset, count, out.data());
    for (std::uint64_t k = 0; k < out.size(); ++k) wrong += out[k] != value(int(id), first * width + k);
  }
  EXPECT_EQ(wrong, 0) << "rank " << world_rank();

  // Read a column block (a tensor-parallel shard: strided in the file).
  auto [col, cols] = block(5, world_rank(), world_size(), 0);
  std::vector<std::uint64_t> offset = {0, col}, count = {13, cols};
  std::vector<float> shard(13 * cols, -1.0f);
  file.read("model/layers.0.weight", offset, count, shard.data());
  for (std::uint64_t r = 0; r < 13; ++r)
    for (std::uint64_t c = 0; c < cols; ++c) wrong += shard[r * cols + c] != value(0, r * 5 + col + c);
  EXPECT_EQ(wrong, 0) << "rank " << world_rank() << ": column shard differs";
}

// ZeRO shards hold arbitrary row-major element ranges: partial rows, whole rows, partial planes.
TEST_F(CheckpointIo, ElementRangesWriteAndReadAnyCut) {
  const std::vector<std::uint64_t> shape = {5, 7, 3};  // 105 elements
  const std::uint64_t total = 105;
  // Cut points that fall inside rows and planes; every rank writes one range, rank r the r-th.
  const auto cut = [&](int part, int parts, std::uint64_t skew) {
    if (part == 0) return std::uint64_t{0};
    if (part == parts) return total;
    return std::min<std::uint64_t>(total, total * static_cast<std::uint64_t>(part) / static_cast<std::uint64_t>(parts) + skew);
  };
  const int r = world_rank(), n = world_size();
  const std::uint64_t first = cut(r, n, 4), last = cut(r + 1, n, 4);
  std::vector<float> mine;
  for (std::uint64_t k = first; k < last; ++k) mine.push_back(value(9, k));
  io::CheckpointContent content;
  io::TensorSlab slab;
  slab.path = "model/blocks.0.attn.qkv.weight";
  slab.shape = shape;
  slab.offset = {0, 0, 0};
  slab.count = shape;
  slab.by_elements = true;
  slab.first = first;
  slab.last = last;
  slab.data = mine.data();
  content.tensors.push_back(slab);
  const std::string path = dir() + "/checkpoints/elements.h5";
  io::write_checkpoint(MPI_COMM_WORLD, path, content);

  io::CheckpointFile file(MPI_COMM_WORLD, path);
  std::vector<float> all(total);
  file.read(slab.path, std::vector<std::uint64_t>(3, 0), shape, all.data());
  int wrong = 0;
  for (std::uint64_t k = 0; k < total; ++k) wrong += all[k] != value(9, k);
  EXPECT_EQ(wrong, 0) << "rank " << r;
  // Read back under other cuts, including ones of a single element and empty ones.
  for (const auto& [a, b] : std::vector<std::pair<std::uint64_t, std::uint64_t>>{
           {cut(r, n, 17), cut(r + 1, n, 17)}, {22, 23}, {20, 20}, {1, 104}, {21, 63}}) {
    std::vector<float> out(b - a + 1, -1.0f);
    file.read_elements(slab.path, slab.offset, shape, a, b, out.data());
    for (std::uint64_t k = a; k < b; ++k) wrong += out[k - a] != value(9, k);
    EXPECT_EQ(out[b - a], -1.0f) << "read past the range";
  }
  EXPECT_EQ(wrong, 0) << "rank " << r;
  expect_input_error([&] { file.read_elements(slab.path, slab.offset, shape, 100, 106, all.data()); },
                     {path, "cannot read elements [100, 106)"});
  // Elements of a block: rows 1..3, columns 2..5 of plane... the block [1:4, 2:6, 0:3] (36
  // elements), its elements [5, 29): partial rows inside partial planes.
  const std::vector<std::uint64_t> boff = {1, 2, 0}, bcnt = {3, 4, 3};
  std::vector<float> blk(24);
  file.read_elements(slab.path, boff, bcnt, 5, 29, blk.data());
  for (std::uint64_t k = 5; k < 29; ++k) {
    const std::uint64_t i = k / 12, j = (k / 3) % 4, c = k % 3;
    wrong += blk[k - 5] != value(9, ((i + 1) * 7 + j + 2) * 3 + c);
  }
  EXPECT_EQ(wrong, 0) << "rank " << r << ": block element range";
}

TEST_F(CheckpointIo, AttributesRoundTrip) {
  const std::string path = write_test_checkpoint(dir(), "attrs.h5");
  io::CheckpointFile file(MPI_COMM_WORLD, path);
  std::map<std::string, io::Attr> root = file.root_attrs();
  EXPECT_EQ(root.at("format"), io::Attr(std::string("tessera-checkpoint")));
  EXPECT_EQ(root.at("format_version"), io::Attr(io::kCheckpointFormatVersion));
  EXPECT_EQ(root.at("step"), io::Attr(std::int64_t{1200}));
  EXPECT_EQ(root.at("seed"), io::Attr(std::int64_t{-7}));
  EXPECT_EQ(root.at("lr"), io::Attr(0.125));
  EXPECT_EQ(root.at("deck"), io::Attr(kDeck));
  EXPECT_EQ(root.at("layout"), io::Attr(std::string("dp=2,tp=1,pp=1,zero=0")));
  std::map<std::string, io::Attr> optimizer = file.group_attrs("optimizer");
  EXPECT_EQ(optimizer.at("kind"), io::Attr(std::string("sgd")));
  EXPECT_EQ(optimizer.at("step"), io::Attr(std::int64_t{1200}));
  EXPECT_EQ(file.group_attrs("train").at("loss_scale"), io::Attr(65536.0));
  EXPECT_TRUE(file.group_attrs("nothing").empty());
}

TEST_F(CheckpointIo, WrongFilesAndMissingDatasetsAreInputErrors) {
  const std::string dataset_file = dir() + "/dataset.h5";
  if (world_rank() == 0) {
    io::DatasetWriter out(dataset_file);
    out.write("/train/labels", {2}, std::span<const std::int32_t>(std::vector<std::int32_t>{1, 2}));
    out.write_attr("/", "format", std::string("tessera-dataset"));
    out.close();
  }
  MPI_Barrier(MPI_COMM_WORLD);
  expect_input_error([&] { io::CheckpointFile(MPI_COMM_WORLD, dataset_file); },
                     {dataset_file, "not a Tessera checkpoint", "tessera-dataset"});
  expect_input_error([&] { io::CheckpointFile(MPI_COMM_WORLD, dir() + "/absent.h5"); },
                     {dir() + "/absent.h5", "no such file"});

  const std::string path = write_test_checkpoint(dir(), "missing.h5");
  io::CheckpointFile file(MPI_COMM_WORLD, path);
  EXPECT_FALSE(file.has("model/layers.9.weight"));
  EXPECT_TRUE(file.has("model/layers.0.weight"));
  EXPECT_FALSE(file.has("model"));  // a group, not a dataset
  expect_input_error([&] { file.shape("model/layers.9.weight"); }, {path, "model/layers.9.weight"});
  // A hyperslab outside the tensor on one rank only: every rank throws.
  std::vector<std::uint64_t> offset = {world_rank() == world_size() - 1 ? 12u : 0u}, count = {2};
  std::vector<float> out(2);
  expect_input_error([&] { file.read("model/layers.0.bias", offset, count, out.data()); },
                     {path, "model/layers.0.bias", "cannot read [2] at [12]"});
}

TEST_F(CheckpointIo, InspectAndH5pyReadTheFile) {
  const std::string path = write_test_checkpoint(dir(), "outside.h5");
  if (world_rank() != 0) return;
  std::ostringstream text;
  io::inspect_checkpoint(path, text);
  for (const char* part : {"step            1200", "  deck:\n    [run]\n    seed = 7", "optimizer:",
                           "model/layers.0.weight", "[13,5]", "float32"}) {
    EXPECT_NE(text.str().find(part), std::string::npos) << "inspect lacks \"" << part << "\":\n" << text.str();
  }
  if (std::system("/usr/bin/python3 -c 'import h5py' 2>/dev/null") != 0) {
    GTEST_SKIP() << "/usr/bin/python3 with h5py is missing; the h5py check is optional";
  }
  const std::string script =
      "import h5py, sys\n"
      "f = h5py.File(sys.argv[1], 'r')\n"
      "assert f.attrs['format'] == 'tessera-checkpoint', f.attrs['format']\n"
      "assert isinstance(f.attrs['deck'], str) and f.attrs['deck'].startswith('[run]')\n"
      "assert f['optimizer'].attrs['kind'] == 'sgd'\n"
      "w = f['model/layers.0.weight'][...]\n"
      "assert w.shape == (13, 5) and w.dtype == 'float32' and w[12, 4] == 0.5 * 64, w\n";
  const std::string cmd = "/usr/bin/python3 -c \"$TESSERA_H5PY_SCRIPT\" " + path;
  setenv("TESSERA_H5PY_SCRIPT", script.c_str(), 1);
  EXPECT_EQ(std::system(cmd.c_str()), 0) << "h5py could not read " << path;
}
