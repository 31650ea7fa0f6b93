// tessera import: a safetensors file with the names `tessera export` writes (Tessera's, or Hugging
// Face's for a gpt) into a checkpoint of the deck's model that train --resume and eval accept.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <chrono>
#include <ctime>
#include <filesystem>
#include <iostream>
#include <optional>
#include <set>

#include "cli/export.hpp"
#include "cli/export_state.hpp"
#include "cli/tensor_map.hpp"
#include "comm/agree.hpp"
#include "comm/communicator.hpp"
#include "core/deck.hpp"
#include "core/error.hpp"
#include "core/version.hpp"
#include "io/checkpoint_file.hpp"
#include "io/dataset.hpp"
#include "io/safetensors.hpp"
#include "optim/optimizer.hpp"
#include "train/field_norm.hpp"
#include "train/trainer.hpp"

namespace tessera::cli {

namespace {

using Shape = std::vector<std::uint64_t>;

std::string iso8601_now() {
  const std::time_t t = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

// One tensor of the checkpoint to write and where it comes from in the file (null: zeros).
struct Planned {
  std::string path;  ///< "model/<name>", "optimizer/<name>/<state>"
  const TensorMapping* mapping;
  const io::SafetensorsEntry* entry;
};

// The file's entry for `name` in `shape`, or an InputError naming the first mismatch.
const io::SafetensorsEntry& expect(const io::SafetensorsFile& file, const std::string& name, const Shape& shape,
                                   const std::string& deck) {
  const io::SafetensorsEntry* e = file.find(name);
  if (e == nullptr)
    throw InputError(fmt::format("{}: tensor {} is missing; the model of {} needs it, of shape [{}]", file.path(),
                                 name, deck, fmt::join(shape, ",")));
  if (e->shape != shape)
    throw InputError(fmt::format("{}: tensor {} has shape [{}]; the model of {} needs [{}]", file.path(), name,
                                 fmt::join(e->shape, ","), deck, fmt::join(shape, ",")));
  return *e;
}

// Every tensor of the checkpoint, matched against the file: the model's in order, then each state
// of each parameter (from the file with_state, else zeros); nothing else may be in the file.
std::vector<Planned> plan(const io::SafetensorsFile& file, const std::vector<TensorMapping>& map,
                          const Config& cfg, bool with_state) {
  const std::string& deck = cfg.deck_path;
  std::vector<Planned> out;
  std::set<std::string> used;
  for (const TensorMapping& t : map) {
    out.push_back({"model/" + t.name, &t, &expect(file, t.exported, t.exported_shape, deck)});
    used.insert(t.exported);
  }
  const Optimizer opt(cfg.optimizer, 0);
  for (const std::string& state : opt.state_names())
    for (const TensorMapping& t : map) {
      const std::string name = optimizer_name(t.exported, state);
      out.push_back({fmt::format("optimizer/{}/{}", t.name, state), &t,
                     with_state ? &expect(file, name, t.exported_shape, deck) : nullptr});
      used.insert(name);
    }
  for (const io::SafetensorsEntry& e : file.entries())
    if (!used.count(e.name))
      throw InputError(fmt::format("{}: tensor {} is not part of the model of {}{}", file.path(), e.name, deck,
                                   e.name.starts_with("optimizer/")
                                       ? fmt::format(" (optimizer.kind = \"{}\" keeps {})", opt.kind_name(),
                                                     opt.state_names().empty() ? std::string("no state")
                                                                               : fmt::format("{}", fmt::join(opt.state_names(), ", ")))
                                       : std::string()));
  return out;
}

// The values of each planned tensor in Tessera's layout (rank 0 reads; other ranks hold nothing).
std::vector<std::vector<float>> read_planned(const io::SafetensorsFile& file, const std::vector<Planned>& plan) {
  std::vector<std::vector<float>> values;
  for (const Planned& p : plan) {
    std::uint64_t n = 1;
    for (std::uint64_t d : p.mapping->shape) n *= d;
    values.push_back(p.entry ? from_exported(*p.mapping, file.read(*p.entry)) : std::vector<float>(n, 0.0f));
    if (p.entry && p.path.ends_with("/exp_avg_sq") &&
        std::any_of(values.back().begin(), values.back().end(), [](float v) { return v < 0.0f; }))
      throw InputError(fmt::format("{}: tensor {} holds a negative value; AdamW's second moments are >= 0",
                                   file.path(), p.entry->name));
  }
  return values;
}

// A unet's normalisation statistics from the file's metadata (what `export` writes), for a deck
// that standardises its fields; nullopt where the file has none (eval then computes them).
std::optional<nn::FieldNorm> import_norm(const io::SafetensorsFile& file, const Config& cfg, const ModelShape& shape) {
  if (cfg.model.kind != ModelKind::unet) return std::nullopt;
  const nn::UNetShape u = unet_shape(cfg, shape);
  std::optional<nn::FieldNorm> norm = metadata_norm(file.path(), file.metadata(), u.in_channels, u.out_channels);
  if (norm && !normalizes_fields(cfg))
    throw InputError(fmt::format("{}: holds the normalisation statistics of a model trained on standardised fields "
                                 "({}*), but the deck {} says data.normalize = \"none\"; import it with a deck that "
                                 "standardises them (data.normalize = \"auto\" or \"channel\")",
                                 file.path(), kMetaNorm, cfg.deck_path));
  return norm;
}

}  // namespace

int import_checkpoint(const ImportArgs& args) {
  const Config cfg = load_deck(args.deck.deck, args.deck.overrides);
  const Communicator comm(MPI_COMM_WORLD, world_size(), 1, 1);
  // The model the deck trains: the shape its data give it, as train builds it.
  ModelShape shape;
  {
    const auto split = io::open_split(comm.handle(Group::data), cfg.data.path, cfg.data.train_split,
                                      cfg.model.context, false, data_cache_limit(comm));
    shape = model_shape(cfg, split->info());
  }

  std::unique_ptr<io::SafetensorsFile> file;
  std::vector<TensorMapping> map;
  std::vector<Planned> planned;
  StoredState state;
  std::optional<nn::FieldNorm> norm;
  std::vector<std::vector<float>> values;
  agree(comm.handle(), [&] {
    std::error_code ec;
    if (std::filesystem::exists(args.out, ec) || std::filesystem::is_symlink(args.out, ec))
      throw InputError(fmt::format("--out {}: exists; import writes a new checkpoint (remove it or name another)",
                                   args.out));
    file = std::make_unique<io::SafetensorsFile>(args.file);
    const bool hf = cfg.model.kind == ModelKind::gpt && file->find("transformer.wte.weight") != nullptr;
    map = tensor_map(cfg, logical_params(cfg, shape), hf ? Naming::hf_gpt2 : Naming::torch);
    // Optimizer state, or the train state an --optimizer export of a stateless optimizer carries.
    const bool with_state =
        file->metadata().count(std::string(kMetaTrain) + "step") > 0 ||
        std::any_of(file->entries().begin(), file->entries().end(),
                    [](const io::SafetensorsEntry& e) { return e.name.starts_with("optimizer/"); });
    planned = plan(*file, map, cfg, with_state);
    state = with_state ? metadata_state(file->path(), file->metadata(), cfg) : fresh_state(cfg);
    norm = import_norm(*file, cfg, shape);
    if (comm.is_root()) values = read_planned(*file, planned);
  });

  io::CheckpointContent c;
  const std::int64_t step = std::get<std::int64_t>(state.train.at("step"));
  c.root_attrs = {{"step", step},
                  {"epoch", state.train.at("epoch")},
                  {"samples_seen", state.train.at("samples_seen")},
                  {"seed", static_cast<std::int64_t>(cfg.run.seed)},
                  {"layout", comm.layout(0)},
                  {"deck", cfg.resolved_toml},
                  {"created", iso8601_now()},
                  {"tessera_version", std::string(TESSERA_VERSION)}};
  c.group_attrs["optimizer"] = state.optimizer;
  c.group_attrs["train"] = state.train;
  for (std::size_t i = 0; i < planned.size(); ++i) {
    io::TensorSlab slab;
    slab.path = planned[i].path;
    slab.shape = planned[i].mapping->shape;
    slab.offset.assign(slab.shape.size(), 0);
    slab.count = comm.is_root() ? slab.shape : Shape(slab.shape.size(), 0);
    slab.data = comm.is_root() ? values[i].data() : nullptr;
    c.tensors.push_back(std::move(slab));
  }
  const FieldNormValues norm_values = field_norm_values(norm.value_or(nn::FieldNorm{}));
  if (norm) {
    c.group_attrs[kFieldNormGroup] = field_norm_attrs();
    for (io::TensorSlab& slab : field_norm_slabs(norm_values, comm.is_root())) c.tensors.push_back(std::move(slab));
  }
  io::write_checkpoint(comm.handle(), args.out, c);
  if (comm.is_root())
    std::cout << fmt::format("imported {} into {}: the {} of {} ({} tensors, {} optimizer state{}), step {}; "
                             "`tessera train {} --resume {}` {} from it\n",
                             args.file, args.out, describe_model(cfg, shape), args.deck.deck, map.size(),
                             step > 0 ? "its" : "zero", norm ? ", the fields' normalisation statistics" : "", step,
                             args.deck.deck, args.out, step > 0 ? "continues" : "fine-tunes")
              << std::flush;
  return 0;
}

}  // namespace tessera::cli
