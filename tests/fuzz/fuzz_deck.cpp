// fuzz_deck: the bytes as a deck, taken as far as `tessera check` and the start of `tessera train`
// take one without opening data: load_deck (with --set overrides) -> the resolved deck read back
// (load_deck of to_toml gives the same Config, core/deck.hpp) -> resolve_layout for a rank count
// -> the model's shape for a synthetic dataset -> the model of every corner rank's part, its
// stages and parameters -> estimate_memory, the sampler. docs/robustness.md.
//
// Input: an 8-byte header, then the deck's TOML text; the bytes after the first NUL, if any, are
// --set overrides, one per line.
//   header[0]      ranks - 1
//   header[1] % 4  the dataset: 0 labels [F]; 1 labels, images [C, S, S] (C = header[5] % 4; 0:
//                  [S, S]) with S = 1 + F % 64; 2 float targets [F]; 3 tokens, vocabulary F
//   header[2..3]   F - 1 (little-endian)
//   header[4]      classes - 1 (targets: their width - 1)
//   header[5]      image channels (kind 1)
//   header[6..7]   samples - 1 (little-endian)
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "core/deck.hpp"
#include "fuzz_target.hpp"
#include "io/dataset.hpp"
#include "train/memory_estimate.hpp"
#include "train/model.hpp"
#include "train/sampler.hpp"
#include "train/trainer.hpp"

namespace {

using namespace tessera;

constexpr std::string_view kTarget = "fuzz_deck";
constexpr std::size_t kHeader = 8;

struct Header {
  int ranks = 1;
  int kind = 0;
  std::int64_t size = 1, classes = 1, channels = 0, samples = 1;
};

Header read_header(const std::uint8_t* h) {
  Header out;
  out.ranks = 1 + h[0];
  out.kind = h[1] % 4;
  out.size = 1 + (h[2] | (h[3] << 8));
  out.classes = 1 + h[4];
  out.channels = h[5] % 4;
  out.samples = 1 + (h[6] | (h[7] << 8));
  return out;
}

// What an opened split would report for the header's dataset (io::SplitInfo of dataset.hpp and
// token_dataset.hpp).
io::SplitInfo synthetic_split(const Header& h, const Config& cfg) {
  io::SplitInfo info;
  info.file = "synthetic.h5";
  info.split = "train";
  info.samples = h.samples;
  info.has_labels = h.kind != 2;
  info.classes = h.classes;
  switch (h.kind) {
    case 0: info.sample_shape = {h.size}; break;
    case 1: {
      const std::int64_t side = 1 + h.size % 64;
      info.sample_shape = h.channels == 0 ? std::vector<std::int64_t>{side, side}
                                          : std::vector<std::int64_t>{h.channels, side, side};
      break;
    }
    case 2:
      info.sample_shape = {h.size};
      info.target_width = h.classes;
      info.classes = 0;
      break;
    default:
      info.sample_shape = {cfg.model.context};
      info.classes = h.size;
      info.label_width = cfg.model.context;
      break;
  }
  info.features = 1;
  for (std::int64_t d : info.sample_shape) info.features *= d;
  return info;
}

std::vector<std::string> split_overrides(const std::uint8_t* data, std::size_t size) {
  std::vector<std::string> lines;
  std::string line;
  for (std::size_t i = 0; i < size; ++i) {
    if (data[i] == '\n') {
      if (!line.empty()) lines.push_back(line);
      line.clear();
    } else {
      line.push_back(static_cast<char>(data[i]));
    }
  }
  if (!line.empty()) lines.push_back(line);
  return lines;
}

// The resolved deck read back must give the same Config (core/deck.hpp, to_toml).
void check_round_trip(const Config& cfg) {
  const std::string path = fuzz::write_temp(cfg.resolved_toml, ".toml");
  Config again;
  try {
    again = load_deck(path, {});
  } catch (const InputError& e) {
    std::filesystem::remove(path);
    fuzz::finding(kTarget, std::string("the resolved deck does not load again: ") + e.what());
  }
  std::filesystem::remove(path);
  again.deck_path = cfg.deck_path;
  // A warning begins with where its keys were set ("deck.toml:38: ..."): the resolved deck puts
  // them on other lines, so the warnings are compared without that place.
  const auto unplaced = [](std::vector<std::string> warnings) {
    for (auto& w : warnings)
      if (const auto at = w.find(": "); at != std::string::npos) w.erase(0, at + 2);
    return warnings;
  };
  if (unplaced(again.warnings) == unplaced(cfg.warnings)) again.warnings = cfg.warnings;
  if (!(again == cfg)) {
    fuzz::finding(kTarget, "the resolved deck loads as another Config:\n" + cfg.resolved_toml +
                               "\n--- read back as ---\n" + again.resolved_toml);
  }
}

// The networks of the first and last tensor rank of the first and last stage, as a run builds
// them on those ranks (every chunk of the stage, registered only, nothing allocated).
void build_parts(const Config& cfg, const ModelShape& shape) {
  const std::vector<int> bounds = stage_bounds(cfg, shape);
  const int pp = cfg.parallel.pipeline, tp = cfg.parallel.tensor;
  const int chunks = pp * cfg.parallel.virtual_stages;
  if (static_cast<int>(bounds.size()) != chunks + 1)
    fuzz::finding(kTarget, "stage_bounds gave " + std::to_string(bounds.size()) + " bounds for " +
                               std::to_string(chunks) + " chunks");
  for (int p : {0, pp - 1})
    for (int t : {0, tp - 1}) {
      ModelPart part;
      part.chunks = stage_chunks(cfg, bounds, p);
      part.tp = tp;
      part.t = t;
      part.tensor_sum = [](float*, std::size_t) {};  // never called: nothing runs
      nn::ParamStore<float> store;
      for (std::size_t c = 0; c < part.chunks.size(); ++c) {
        if (c > 0) store.begin_bucket();
        make_network(store, cfg, shape, part, c);
      }
    }
}

void check_estimate(const MemoryEstimate& e) {
  for (double v : {e.parameters, e.gradients, e.optimizer, e.activations, e.comm, e.data})
    if (!std::isfinite(v) || v < 0)
      fuzz::finding(kTarget, "estimate_memory gave a category of " + std::to_string(v) + " bytes");
  if (e.micro_batch < 1) fuzz::finding(kTarget, "estimate_memory: micro-batch " + std::to_string(e.micro_batch));
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  fuzz::start(argc, argv, true);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < kHeader) return -1;  // not kept in the corpus
  const Header header = read_header(data);
  data += kHeader;
  size -= kHeader;
  std::size_t deck_size = 0;
  while (deck_size < size && data[deck_size] != 0) ++deck_size;
  const std::vector<std::string> overrides =
      deck_size < size ? split_overrides(data + deck_size + 1, size - deck_size - 1)
                       : std::vector<std::string>{};
  const fuzz::TempFile deck(data, deck_size, ".toml");

  fuzz::expect_input_errors_only(kTarget, "check", [&] {
    Config cfg = load_deck(deck.path(), overrides);
    check_round_trip(cfg);
    resolve_layout(cfg, header.ranks);
    const io::SplitInfo info = synthetic_split(header, cfg);
    const ModelShape shape = model_shape(cfg, info);
    (void)describe_model(cfg, shape);
    (void)logical_params(cfg, shape);
    build_parts(cfg, shape);
    check_estimate(estimate_memory(cfg, shape));
    (void)micro_batch_rows(cfg);
    (void)Sampler(info.samples, cfg.run.seed, cfg.train.global_batch, cfg.train.drop_last).batches_per_epoch();
  });
  return 0;
}
