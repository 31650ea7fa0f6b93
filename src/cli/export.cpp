// tessera export: a checkpoint's model (and optionally its optimizer state) as safetensors or a
// torch.save state_dict with PyTorch's or Hugging Face's names, plus the JSON that describes it.
#include "cli/export.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <filesystem>
#include <set>
#include <iostream>

#include "cli/export_state.hpp"
#include "cli/tensor_map.hpp"
#include "comm/agree.hpp"
#include "comm/communicator.hpp"
#include "core/deck.hpp"
#include "core/error.hpp"
#include "io/checkpoint_file.hpp"
#include "io/small_file.hpp"
#include "io/safetensors.hpp"
#include "io/tensor_check.hpp"
#include "io/torch_zip.hpp"
#include "optim/optimizer.hpp"
#include "train/field_norm.hpp"

namespace tessera::cli {

namespace {

namespace fs = std::filesystem;
using Shape = std::vector<std::uint64_t>;

// The checkpoint's deck (root attribute `deck`), its layout reset: the model is layout-free.
Config checkpoint_config(const io::CheckpointFile& file) {
  const auto attrs = file.root_attrs();
  const auto it = attrs.find("deck");
  if (it == attrs.end() || !std::holds_alternative<std::string>(it->second))
    throw InputError(fmt::format("{}: root attribute deck is missing or not a string; it holds the deck "
                                 "that says what the model is", file.path()));
  Config cfg = load_deck_text(std::get<std::string>(it->second), file.path() + " (attribute deck)");
  cfg.parallel = ParallelConfig{};
  return cfg;
}

Shape shape_of(const io::CheckpointFile& file, const std::string& name, std::size_t rank) {
  const Shape s = file.shape("model/" + name);
  if (s.size() != rank)
    throw InputError(fmt::format("{}: tensor model/{} has shape [{}], expected {} dimensions", file.path(),
                                 name, fmt::join(s, ","), rank));
  return s;
}

// What the data gave the model, recovered from the checkpoint's tensors (the data are not needed
// to export). A CNN's image size is not recoverable, only the flattened width of its features:
// the shape chosen here gives that width (checked against the deck's model with every tensor).
ModelShape shape_from_checkpoint(const io::CheckpointFile& file, const Config& cfg) {
  ModelShape s;
  const auto& m = cfg.model;
  if (is_transformer(m.kind)) {
    s.in_features = m.context;
    s.outputs = static_cast<std::int64_t>(shape_of(file, "wte.weight", 2)[0]);
    s.sample_shape = {m.context};
    return s;
  }
  if (m.kind == ModelKind::unet) {
    // Fully convolutional: any field whose rows and columns the levels' pools halve evenly fits
    // the same tensors; the smallest such (at least kernel/2 rows at the coarsest level) stands in.
    const auto in = static_cast<std::int64_t>(shape_of(file, "down.0.conv1.weight", 4)[1]);
    const auto out = static_cast<std::int64_t>(shape_of(file, "head.weight", 4)[0]);
    if (m.channels.size() > 31)
      throw InputError(fmt::format("{}: its deck's model.channels has {} levels; a unet has at most 31", file.path(),
                                   m.channels.size()));
    const std::int64_t side = (std::int64_t{1} << (m.channels.size() - 1)) * std::max(1, m.kernel / 2);
    if (side > (std::int64_t{1} << 30) || double(std::max(in, out)) * double(side) * double(side) > 0x1p62)
      throw InputError(fmt::format("{}: its deck's model ({} levels, model.kernel = {}, {} -> {} channels) fits no "
                                   "field of a size Tessera handles", file.path(), m.channels.size(), m.kernel, in, out));
    s.classification = false;
    s.sample_shape = {in, side, side};
    s.target_shape = {out, side, side};
    s.in_features = in * side * side;
    s.outputs = out * side * side;
    return s;
  }
  const std::string last = m.kind == ModelKind::cnn ? "fc." : "layers.";
  s.outputs = static_cast<std::int64_t>(shape_of(file, fmt::format("{}{}.weight", last, m.hidden.size()), 2)[0]);
  const Shape first = shape_of(file, last + "0.weight", 2);
  if (m.kind == ModelKind::mlp) {
    s.in_features = static_cast<std::int64_t>(first[1]);
    s.sample_shape = {s.in_features};
    return s;
  }
  const auto channels = static_cast<std::int64_t>(shape_of(file, "convs.0.weight", 4)[1]);
  const auto last_channels = static_cast<std::uint64_t>(m.channels.back());
  if (first[1] % last_channels != 0)
    throw InputError(fmt::format("{}: tensor model/fc.0.weight has {} inputs, not a multiple of the last "
                                 "convolution's {} channels", file.path(), first[1], last_channels));
  const std::int64_t pools = std::int64_t{1} << m.channels.size();
  s.sample_shape = {channels, static_cast<std::int64_t>(first[1] / last_channels) * pools, pools};
  s.in_features = s.sample_shape[0] * s.sample_shape[1] * s.sample_shape[2];
  return s;
}

// The checkpoint holds exactly the model's tensors, in their shapes.
void check_model_tensors(const io::CheckpointFile& file, const std::vector<TensorMapping>& map) {
  std::set<std::string> names;
  for (const TensorMapping& t : map) {
    names.insert("model/" + t.name);
    if (!file.has("model/" + t.name))
      throw InputError(fmt::format("{}: tensor model/{} is missing; its deck's model has it", file.path(), t.name));
    const Shape s = file.shape("model/" + t.name);
    if (s != t.shape)
      throw InputError(fmt::format("{}: tensor model/{} has shape [{}]; its deck's model needs [{}]",
                                   file.path(), t.name, fmt::join(s, ","), fmt::join(t.shape, ",")));
  }
  for (const std::string& n : file.list("model"))
    if (!names.count(n)) throw InputError(fmt::format("{}: tensor {} is not part of its deck's model", file.path(), n));
}

// Reads whole tensors on rank 0 (nothing elsewhere), then checks them against their checksums.
// Collective over the file's communicator.
std::vector<std::vector<float>> read_whole(const Communicator& comm, const io::CheckpointFile& file,
                                           const std::vector<std::pair<std::string, Shape>>& tensors) {
  std::vector<std::vector<float>> values;
  std::vector<io::TensorCheck> checks;
  for (const auto& [path, shape] : tensors) {
    const Shape zero(shape.size(), 0), offset(shape.size(), 0);
    const Shape& count = comm.is_root() ? shape : zero;
    std::uint64_t n = 1;
    for (std::uint64_t c : count) n *= c;
    values.emplace_back(n);
    file.read(path, offset, count, values.back().data());
    checks.push_back(io::check_of(io::TensorSlab{path, shape, offset, count, values.back().data()}));
  }
  file.verify(checks);
  return values;
}

struct Outputs {
  std::string model, json, hf_config;  ///< hf_config: config.json, with --hf-gpt2 or --hf-llama only
  std::string dir;                     ///< the directory to create, with --hf-gpt2 or --hf-llama only
};

Outputs output_paths(const ExportArgs& args) {
  const bool torch = args.format == "torch";
  fs::path stem = fs::path(args.checkpoint);
  if (stem.extension() == ".h5") stem.replace_extension();
  Outputs o;
  if (args.hf_gpt2 || args.hf_llama) {
    o.dir = args.out.empty() ? stem.string() + "-hf" : args.out;
    o.model = (fs::path(o.dir) / (torch ? "pytorch_model.bin" : "model.safetensors")).string();
    o.json = (fs::path(o.dir) / "tessera.json").string();
    o.hf_config = (fs::path(o.dir) / "config.json").string();
    return o;
  }
  o.model = args.out.empty() ? stem.string() + (torch ? ".pt" : ".safetensors") : args.out;
  o.json = fs::path(o.model).replace_extension(".json").string();
  if (o.json == o.model)
    throw InputError(fmt::format("--out {}: the model's JSON description goes beside it with the extension "
                                 ".json; name the model file otherwise (model.safetensors, model.pt)", o.model));
  return o;
}

// No output may replace the checkpoint it is made from.
void check_not_the_checkpoint(const Outputs& o, const std::string& checkpoint) {
  std::error_code ec;
  const fs::path source = fs::weakly_canonical(checkpoint, ec);
  for (const std::string& p : {o.model, o.json, o.hf_config})
    if (!p.empty() && !ec && fs::weakly_canonical(p, ec) == source)
      throw InputError(fmt::format("--out: {} is the checkpoint being exported; write the export elsewhere", p));
}

void write_outputs(const ExportArgs& args, const Outputs& o, const std::vector<io::NamedTensor>& tensors,
                   const std::map<std::string, std::string>& metadata, const std::string& json,
                   const std::string& hf_config) {
  std::error_code ec;
  const bool new_dir = !o.dir.empty() && !fs::exists(o.dir, ec);
  if (!o.dir.empty()) {
    fs::create_directories(o.dir, ec);
    if (ec || !fs::is_directory(o.dir))
      throw InputError(fmt::format("--out {}: cannot create the directory: {}", o.dir,
                                   ec ? ec.message() : std::string("a file is in the way")));
  }
  try {
    if (args.format == "torch") io::write_torch_state_dict(o.model, tensors);
    else io::write_safetensors(o.model, tensors, metadata);
    try {
      io::write_file_atomically(o.json, json);
      if (!o.hf_config.empty()) io::write_file_atomically(o.hf_config, hf_config);
    } catch (const InputError&) {
      fs::remove(o.model, ec);  // all or nothing
      fs::remove(o.json, ec);
      throw;
    }
  } catch (const InputError&) {
    if (new_dir) fs::remove_all(o.dir, ec);
    throw;
  }
}

}  // namespace

int export_checkpoint(const ExportArgs& args) {
  const Naming naming = args.hf_gpt2 ? Naming::hf_gpt2 : args.hf_llama ? Naming::hf_llama : Naming::torch;
  const Outputs out = output_paths(args);
  check_not_the_checkpoint(out, args.checkpoint);
  const Communicator comm(MPI_COMM_WORLD, world_size(), 1, 1);
  const io::CheckpointFile file(comm.handle(), args.checkpoint);

  // What the model is: the checkpoint's deck, and the tensors that fit it.
  Config cfg;
  ModelShape shape;
  std::vector<TensorMapping> map;
  std::vector<std::string> states;
  std::map<std::string, std::string> metadata;
  agree(comm.handle(), [&] {
    cfg = checkpoint_config(file);
    shape = shape_from_checkpoint(file, cfg);
    map = tensor_map(cfg, logical_params(cfg, shape), naming);
    if (const int w = attention_window(cfg.model); w > 0 && naming == Naming::hf_gpt2)
      throw InputError(fmt::format("--hf-gpt2: the model attends through a sliding window of {} positions "
                                   "(model.window), which Hugging Face's GPT2LMHeadModel does not; export it without "
                                   "--hf-gpt2 (Tessera's names; the JSON beside it gives the window)", w));
    check_model_tensors(file, map);
    metadata = export_metadata(file, cfg, naming);
    if (args.optimizer) states = optimizer_states(file, cfg, map, metadata);
  });
  // A unet's normalisation statistics (checked against their checksums): in the metadata and the JSON.
  if (cfg.model.kind == ModelKind::unet) {
    const nn::UNetShape u = unet_shape(cfg, shape);
    if (const auto stored = stored_field_norm(file, u.in_channels, u.out_channels)) {
      shape.norm = *stored;
      add_norm_metadata(metadata, shape.norm);
    }
  }

  // The values: the model's tensors, then each parameter's optimizer states.
  std::vector<std::pair<std::string, Shape>> paths;
  for (const TensorMapping& t : map) paths.emplace_back("model/" + t.name, t.shape);
  for (const std::string& state : states)
    for (const TensorMapping& t : map) paths.emplace_back(fmt::format("optimizer/{}/{}", t.name, state), t.shape);
  std::vector<std::vector<float>> values = read_whole(comm, file, paths);

  std::vector<io::NamedTensor> tensors;
  std::size_t parameters = 0;
  for (std::size_t i = 0; i < paths.size(); ++i) {
    const TensorMapping& t = map[i % map.size()];
    const std::string name = i < map.size() ? t.exported : optimizer_name(t.exported, states[i / map.size() - 1]);
    if (i < map.size()) parameters += values[i].size();
    tensors.push_back({name, t.exported_shape, to_exported(t, std::move(values[i]))});
  }
  agree(comm.handle(), [&] {
    if (comm.is_root())
      write_outputs(args, out, tensors, metadata, model_json(cfg, shape, map, naming, metadata),
                    naming == Naming::hf_gpt2    ? hf_gpt2_config(cfg, shape.outputs)
                    : naming == Naming::hf_llama ? hf_llama_config(cfg, shape.outputs)
                                                 : std::string());
  });
  if (comm.is_root())
    std::cout << fmt::format("exported {} ({}, step {}: {} parameters in {} tensors{}) to {}, described in {}{}{}\n",
                             args.checkpoint, to_string(cfg.model.kind), metadata.at(kMetaStep), parameters,
                             map.size(), states.empty() ? "" : fmt::format(", optimizer state {}", fmt::join(states, ", ")),
                             out.model, out.json, out.hf_config.empty() ? "" : " and " + out.hf_config,
                             shape.norm.empty() ? ""
                             : args.format == "torch" ? "; the fields' normalisation statistics in the JSON"
                                                      : "; the fields' normalisation statistics in the JSON and the metadata")
              << std::flush;
  return 0;
}

}  // namespace tessera::cli
