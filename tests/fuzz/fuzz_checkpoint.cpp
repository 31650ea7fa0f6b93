// fuzz_checkpoint: the bytes as a checkpoint, read the ways Tessera reads one, on MPI_COMM_SELF:
//  - io::CheckpointFile: root and group attributes, every dataset listed, its shape, its first
//    rows read by hyperslab and a few elements by element range (reads capped);
//  - io::inspect_checkpoint, as `tessera inspect` (into a string);
//  - cli::diff of the file against itself, as `tessera diff` (on a world of one rank);
//  - Checkpointer::load into the model of seed_mlp.toml, as `train --resume PATH`, then the
//    sampler position the resumed run would take its next batch from.
// docs/robustness.md.
#include <algorithm>
#include <cstdint>
#include <iostream>
#include <memory>
#include <sstream>
#include <streambuf>
#include <string>
#include <vector>

#include "cli/diff.hpp"
#include "comm/communicator.hpp"
#include "core/deck.hpp"
#include "fuzz_target.hpp"
#include "io/checkpoint_file.hpp"
#include "io/inspect.hpp"
#include "optim/optimizer.hpp"
#include "seed_data.hpp"
#include "train/checkpointer.hpp"
#include "train/model.hpp"
#include "train/sampler.hpp"
#include "train/trainer.hpp"

namespace {

using namespace tessera;

constexpr std::string_view kTarget = "fuzz_checkpoint";
constexpr std::uint64_t kMaxRowValues = 1 << 16;  // values per row read
constexpr std::uint64_t kMaxRows = 8;             // rows read per dataset, 3 at a time

// The model that checkpoints are loaded into, built once.
struct Loader {
  Config cfg;
  ModelShape shape;
  std::unique_ptr<Communicator> comm;
  std::unique_ptr<Sharding> sharding;
  std::unique_ptr<Model> model;
  std::unique_ptr<Optimizer> optimizer;
  std::unique_ptr<Checkpointer> checkpointer;
};
std::unique_ptr<Loader> g_loader;

void build_loader() {
  auto l = std::make_unique<Loader>();
  l->cfg = load_deck(TESSERA_FUZZ_SEED_DECK, {});
  resolve_layout(l->cfg, 1);
  l->shape.in_features = fuzz::kSeedImageSide * fuzz::kSeedImageSide;
  l->shape.outputs = fuzz::kSeedClasses;
  l->shape.classification = true;
  l->shape.sample_shape = {fuzz::kSeedImageSide, fuzz::kSeedImageSide};
  l->comm = std::make_unique<Communicator>(MPI_COMM_SELF, 1, 1, 1, l->cfg.comm);
  l->sharding = std::make_unique<Sharding>(l->cfg, *l->comm);
  l->model = std::make_unique<Model>(l->cfg, l->shape, l->cfg.train.global_batch, l->sharding->layout(),
                                     model_part(l->cfg, *l->comm, l->shape));
  l->sharding->bind(l->model->params());
  l->optimizer = std::make_unique<Optimizer>(l->cfg.optimizer, l->sharding->state_size());
  l->checkpointer = std::make_unique<Checkpointer>(l->cfg, *l->comm);
  g_loader = std::move(l);
}

void free_loader() { g_loader.reset(); }

// The first rows of one dataset by hyperslab, then a few of their elements by element range.
void read_dataset(const io::CheckpointFile& f, const std::string& name) {
  const std::vector<std::uint64_t> shape = f.shape(name);
  if (shape.empty()) return;  // a scalar: no hyperslab of rank >= 1 to read
  std::uint64_t row = 1;
  for (std::size_t d = 1; d < shape.size(); ++d)
    if (__builtin_mul_overflow(row, shape[d], &row)) return;
  if (row > kMaxRowValues) return;
  const std::uint64_t rows = std::min(shape[0], kMaxRows);
  std::vector<std::uint64_t> offset(shape.size(), 0), count = shape;
  std::vector<float> values(3 * row);
  for (std::uint64_t first = 0; first < rows; first += 3) {
    offset[0] = first;
    count[0] = std::min<std::uint64_t>(3, rows - first);
    f.read(name, offset, count, values.data());
  }
  offset[0] = 0;
  count[0] = std::min<std::uint64_t>(3, shape[0]);
  const std::uint64_t elements = count[0] * row;
  if (elements > 1) f.read_elements(name, offset, count, 1, std::min<std::uint64_t>(elements, 7), values.data());
}

void read_checkpoint_file(const std::string& path) {
  io::CheckpointFile f(MPI_COMM_SELF, path);
  (void)f.root_attrs();
  for (const char* group : {"optimizer", "train", "model"}) (void)f.group_attrs(group);
  (void)f.list("model");
  for (const std::string& name : f.list("")) {
    if (!f.has(name)) fuzz::finding(kTarget, "list() names " + name + ", which has() denies");
    fuzz::expect_input_errors_only(kTarget, "CheckpointFile::read " + name, [&] { read_dataset(f, name); });
  }
}

// A stream buffer that drops what is written: diff prints its table to std::cout.
class NullBuffer : public std::streambuf {
 protected:
  int overflow(int c) override { return traits_type::not_eof(c); }
  std::streamsize xsputn(const char*, std::streamsize n) override { return n; }
};

void diff_with_itself(const std::string& path) {
  NullBuffer null;
  std::streambuf* const saved = std::cout.rdbuf(&null);
  try {
    cli::DiffArgs args;
    args.a = path;
    args.b = path;
    args.tolerance = 0.0;
    const int code = cli::diff(args);
    std::cout.rdbuf(saved);
    if (code != 0) fuzz::finding(kTarget, "diff of a file with itself exits " + std::to_string(code));
  } catch (...) {
    std::cout.rdbuf(saved);
    throw;
  }
}

// As `train --resume PATH`: load, then take the next batch where the checkpoint says.
void resume(const std::string& path) {
  Loader& l = *g_loader;
  const TrainState s = l.checkpointer->load(path, *l.model, *l.sharding, *l.optimizer);
  Sampler sampler(fuzz::kSeedTrainSamples, l.cfg.run.seed, l.cfg.train.global_batch, l.cfg.train.drop_last);
  if (s.step < l.cfg.train.steps) (void)sampler.global_batch(s.epoch, s.batch_in_epoch);
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  fuzz::start(argc, argv, true, free_loader);
  build_loader();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const fuzz::TempFile file(data, size, ".h5");
  fuzz::expect_input_errors_only(kTarget, "CheckpointFile", [&] { read_checkpoint_file(file.path()); });
  fuzz::expect_input_errors_only(kTarget, "inspect", [&] {
    std::ostringstream out;
    io::inspect_checkpoint(file.path(), out);
  });
  fuzz::expect_input_errors_only(kTarget, "diff", [&] { diff_with_itself(file.path()); });
  fuzz::expect_input_errors_only(kTarget, "Checkpointer::load", [&] { resume(file.path()); });
  return 0;
}
