// tessera import: a safetensors file (or a sharded set of them) with the names `tessera export`
// writes (Tessera's, or Hugging Face's for a gpt or a llama) into a checkpoint of the deck's model
// that train --resume and eval accept.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <chrono>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <set>

#include <nlohmann/json.hpp>

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
#include "kernels/layernorm.hpp"
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
  int owner = 0;  ///< the rank that reads it and writes it whole
};

std::uint64_t elements(const Shape& shape) {
  std::uint64_t n = 1;
  for (std::uint64_t d : shape) n *= d;
  return n;
}

// Each tensor to one rank, the largest first to the rank with the fewest elements so far (ties:
// the lowest rank; the same on every rank), so that no rank reads or holds the whole model.
void assign_owners(std::vector<Planned>& plan, int ranks) {
  std::vector<std::size_t> order(plan.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    return elements(plan[a].mapping->shape) > elements(plan[b].mapping->shape);
  });
  std::vector<std::uint64_t> load(static_cast<std::size_t>(ranks), 0);
  for (std::size_t i : order) {
    const auto least = static_cast<std::size_t>(std::min_element(load.begin(), load.end()) - load.begin());
    plan[i].owner = static_cast<int>(least);
    load[least] += elements(plan[i].mapping->shape);
  }
}

// The file's entry for `name` in `shape`, or an InputError naming the first mismatch.
const io::SafetensorsEntry& expect(const io::SafetensorsModel& file, const std::string& name, const Shape& shape,
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

// Tensors of Hugging Face files that are not parameters: GPT-2's causal-mask buffers
// (`h.<i>.attn.bias` [1, 1, n, n] and `attn.masked_bias`, in older files), older Llama files'
// rotary frequencies (`layers.<i>.self_attn.rotary_emb.inv_freq`, which rope_theta gives), and,
// for a model whose head is tied (a gpt; a llama with model.tie_embeddings), a head that repeats
// the token embedding (`lm_head.weight`: checked to be equal). Anything else is the model's or an
// error.
InputError untied_head(const io::SafetensorsModel& file, const Config& cfg) {
  if (cfg.model.kind == ModelKind::llama)
    return InputError(fmt::format("{}: tensor lm_head.weight differs from the token embedding (an untied head), but "
                                  "the deck {} has model.tie_embeddings = true; import it with "
                                  "model.tie_embeddings = false", file.path(), cfg.deck_path));
  return InputError(fmt::format("{}: tensor lm_head.weight differs from the token embedding; Tessera's gpt ties its "
                                "head to wte (a model with an untied head cannot be imported)", file.path()));
}

bool tied_head(const Config& cfg) {
  return cfg.model.kind == ModelKind::gpt || (cfg.model.kind == ModelKind::llama && cfg.model.tie_embeddings);
}

// embedding: the file's name of the token embedding (wte.weight's mapping).
bool ignored(const io::SafetensorsModel& file, const io::SafetensorsEntry& e, const Config& cfg,
             const std::string& embedding) {
  if (cfg.model.kind == ModelKind::gpt &&
      ((e.name.ends_with(".attn.bias") && e.shape.size() == 4) || e.name.ends_with(".attn.masked_bias")))
    return true;
  if (cfg.model.kind == ModelKind::llama && e.name.ends_with(".self_attn.rotary_emb.inv_freq")) return true;
  if (e.name != "lm_head.weight" || !tied_head(cfg)) return false;
  const io::SafetensorsEntry* wte = file.find(embedding);
  if (wte == nullptr || wte->shape != e.shape) throw untied_head(file, cfg);
  return true;  // its values: check_tied_head, where the embedding's owner has read it
}

// The rank that read the embedding, once the planned tensors are read: a file's lm_head.weight
// that a tied model skips holds the embedding's values.
void check_tied_head(const io::SafetensorsModel& file, const Config& cfg, const std::vector<Planned>& plan,
                     const std::vector<std::vector<float>>& values, int rank) {
  const io::SafetensorsEntry* head = file.find("lm_head.weight");
  if (head == nullptr || !tied_head(cfg)) return;
  for (std::size_t i = 0; i < plan.size(); ++i)
    if (plan[i].path == "model/wte.weight" && plan[i].owner == rank && file.read(*head) != values[i])
      throw untied_head(file, cfg);
}

// Every tensor of the checkpoint, matched against the file: the model's in order, then each state
// of each parameter (from the file with_state, else zeros); nothing else may be in the file.
std::vector<Planned> plan(const io::SafetensorsModel& file, const std::vector<TensorMapping>& map,
                          const Config& cfg, bool with_state) {
  const std::string& deck = cfg.deck_path;
  std::vector<Planned> out;
  std::set<std::string> used;
  std::string embedding;
  for (const TensorMapping& t : map)
    if (t.name == "wte.weight") embedding = t.exported;
  for (const TensorMapping& t : map) {
    if (t.name == "lm_head.weight" && file.find(t.exported) == nullptr && file.find(embedding) != nullptr)
      throw InputError(fmt::format("{}: holds no {}: its head is the token embedding {} (tied), but the deck {} has "
                                   "model.tie_embeddings = false; import it with model.tie_embeddings = true",
                                   file.path(), t.exported, embedding, deck));
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
    if (!used.count(e.name) && !ignored(file, e, cfg, embedding))
      throw InputError(fmt::format("{}: tensor {} is not part of the model of {}{}", file.path(), e.name, deck,
                                   e.name.starts_with("optimizer/")
                                       ? fmt::format(" (optimizer.kind = \"{}\" keeps {})", opt.kind_name(),
                                                     opt.state_names().empty() ? std::string("no state")
                                                                               : fmt::format("{}", fmt::join(opt.state_names(), ", ")))
                                       : std::string()));
  return out;
}

// The values in Tessera's layout of each planned tensor this rank owns (empty for the others).
std::vector<std::vector<float>> read_planned(const io::SafetensorsModel& file, const std::vector<Planned>& plan,
                                             int rank) {
  std::vector<std::vector<float>> values;
  for (const Planned& p : plan) {
    if (p.owner != rank) {
      values.emplace_back();
      continue;
    }
    const std::uint64_t n = elements(p.mapping->shape);
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
std::optional<nn::FieldNorm> import_norm(const io::SafetensorsModel& file, const Config& cfg, const ModelShape& shape) {
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

// Hugging Face's config.json beside the file (or the index), parsed; nullopt where there is none.
std::optional<nlohmann::json> read_hf_config(const std::string& file, std::string& where) {
  const std::filesystem::path path = std::filesystem::path(file).parent_path() / "config.json";
  where = path.string();
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return std::nullopt;
  nlohmann::json j;
  try {
    std::ifstream in(path);
    if (!in) throw InputError(fmt::format("{}: cannot be read", path.string()));
    j = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw InputError(fmt::format("{}: not JSON: {}", path.string(), e.what()));
  }
  if (!j.is_object()) throw InputError(fmt::format("{}: not a JSON object", where));
  return j;
}

// config.json's number at key (nullopt: absent or null); InputError where it is not a number.
std::optional<double> config_number(const nlohmann::json& j, const std::string& where, const char* key) {
  if (!j.contains(key) || j[key].is_null()) return std::nullopt;
  if (!j[key].is_number()) throw InputError(fmt::format("{}: {} is {}; expected a number", where, key, j[key].dump()));
  return j[key].get<double>();
}

// Hugging Face's config.json beside a GPT-2 file: every setting the deck also fixes must agree
// (one line naming both values otherwise); settings Tessera's gpt does not have are refused.
void check_hf_config(const std::string& file, const Config& cfg, const ModelShape& shape) {
  std::string where;
  const std::optional<nlohmann::json> config = read_hf_config(file, where);
  if (!config) return;
  const nlohmann::json& j = *config;
  const std::string deck = cfg.deck_path;
  const auto number = [&](const char* key) { return config_number(j, where, key); };
  if (j.contains("model_type") && j["model_type"] != "gpt2")
    throw InputError(fmt::format("{}: model_type = {}; Tessera's gpt imports \"gpt2\" models", where, j["model_type"].dump()));
  const auto agree_int = [&](const char* key, double deck_value, const char* deck_key) {
    const auto v = number(key);
    if (v && *v != deck_value)
      throw InputError(fmt::format("{}: {} = {}, but the deck {} has {} = {}", where, key, *v, deck, deck_key, deck_value));
  };
  const auto& m = cfg.model;
  agree_int("n_embd", m.width, "model.width");
  agree_int("n_head", m.heads, "model.heads");
  agree_int("n_layer", m.layers, "model.layers");
  agree_int("n_positions", m.context, "model.context");
  agree_int("vocab_size", static_cast<double>(shape.outputs), "the data's vocab_size");
  if (const int w = attention_window(m); w > 0)
    throw InputError(fmt::format("{}: GPT2LMHeadModel attends to every earlier position, but the deck {} has "
                                 "model.window = {} (sliding-window attention); set model.window = 0", where, deck, w));
  if (const auto inner = number("n_inner"); inner && *inner != 4.0 * m.width)
    throw InputError(fmt::format("{}: n_inner = {}; Tessera's gpt has an MLP 4 x model.width = {} wide", where, *inner,
                                 4 * m.width));
  if (const auto eps = number("layer_norm_epsilon"); eps && *eps != kernels::layernorm_eps)
    throw InputError(fmt::format("{}: layer_norm_epsilon = {}; Tessera's LayerNorm uses {}", where, *eps,
                                 kernels::layernorm_eps));
  if (j.contains("activation_function")) {
    const std::string a = j["activation_function"].is_string() ? j["activation_function"].get<std::string>() : j["activation_function"].dump();
    const std::optional<GeluApproximate> form =
        a == "gelu" ? std::optional(GeluApproximate::none)
                    : (a == "gelu_new" || a == "gelu_pytorch_tanh") ? std::optional(GeluApproximate::tanh) : std::nullopt;
    if (!form)
      throw InputError(fmt::format("{}: activation_function = \"{}\"; Tessera's gpt has \"gelu\" (exact) and "
                                   "\"gelu_new\" (GPT-2's tanh form)", where, a));
    if (*form != m.gelu_approximate)
      throw InputError(fmt::format("{}: activation_function = \"{}\" ({} GELU), but the deck {} has "
                                   "model.gelu_approximate = \"{}\"; set it to \"{}\"",
                                   where, a, *form == GeluApproximate::tanh ? "the tanh" : "the exact", deck,
                                   to_string(m.gelu_approximate), to_string(*form)));
  }
  const auto flag = [&](const char* key, bool expected) {
    if (j.contains(key) && j[key].is_boolean() && j[key].get<bool>() != expected)
      throw InputError(fmt::format("{}: {} = {}; Tessera's gpt has {} = {}", where, key, !expected, key, expected));
  };
  flag("tie_word_embeddings", true);
  flag("scale_attn_weights", true);
  flag("scale_attn_by_inverse_layer_idx", false);
  flag("add_cross_attention", false);
}

// Hugging Face's config.json beside a Llama file (or its index): every setting the deck also
// fixes must agree, one line naming the key and both values otherwise; settings Tessera's llama
// does not have (another activation, biases, a scaled or partial rotary embedding) are refused,
// named. rope_theta is read where transformers 4 writes it (top level, beside rope_scaling) and
// where transformers 5 does (rope_parameters: {rope_theta, rope_type "default"}). A Mistral
// (MistralForCausalLM: a llama with a sliding window, the same tensors) gives the deck's
// model.window as its sliding_window; a Llama has none.
void check_hf_llama_config(const std::string& file, const Config& cfg, const ModelShape& shape) {
  std::string where;
  const std::optional<nlohmann::json> config = read_hf_config(file, where);
  if (!config) return;
  const nlohmann::json& j = *config;
  const std::string deck = cfg.deck_path;
  const auto& m = cfg.model;
  const auto number = [&](const char* key) { return config_number(j, where, key); };
  const bool mistral = j.contains("model_type") && j["model_type"] == "mistral";
  if (j.contains("model_type") && j["model_type"] != "llama" && !mistral)
    throw InputError(fmt::format("{}: model_type = {}; Tessera's llama imports \"llama\" and \"mistral\" models",
                                 where, j["model_type"].dump()));
  // The window: Mistral's sliding_window (null: none; one that holds the whole context is none).
  const std::optional<double> sliding = mistral ? number("sliding_window") : std::nullopt;
  const int window = sliding && *sliding < m.context ? static_cast<int>(*sliding) : 0;
  if (window != attention_window(m)) {
    const std::string theirs = window > 0 ? fmt::format("sliding_window = {}", window)
                               : sliding  ? fmt::format("sliding_window = {} (at least model.context: none)", *sliding)
                               : mistral  ? std::string("sliding_window = null (none)")
                                          : std::string("a Llama (no sliding window)");
    throw InputError(fmt::format("{}: {}, but the deck {} has model.window = {}; set model.window = {}", where, theirs,
                                 deck, m.window, window));
  }
  const auto agree_number = [&](const char* key, std::optional<double> value, double deck_value, const char* deck_key) {
    if (value && *value != deck_value)
      throw InputError(fmt::format("{}: {} = {}, but the deck {} has {} = {}", where, key, *value, deck, deck_key,
                                   deck_value));
  };
  agree_number("hidden_size", number("hidden_size"), m.width, "model.width");
  agree_number("num_attention_heads", number("num_attention_heads"), m.heads, "model.heads");
  agree_number("num_key_value_heads", number("num_key_value_heads"), m.kv_heads_or_heads(), "model.kv_heads");
  agree_number("num_hidden_layers", number("num_hidden_layers"), m.layers, "model.layers");
  agree_number("intermediate_size", number("intermediate_size"), m.ffn_width_or_default(), "model.ffn_width");
  agree_number("rms_norm_eps", number("rms_norm_eps"), m.norm_eps, "model.norm_eps");
  agree_number("vocab_size", number("vocab_size"), static_cast<double>(shape.outputs), "the data's vocab_size");
  if (const auto hd = number("head_dim"); hd && *hd != m.width / m.heads)
    throw InputError(fmt::format("{}: head_dim = {}; Tessera's llama has heads of model.width / model.heads = {} "
                                 "channels", where, *hd, m.width / m.heads));
  if (const auto positions = number("max_position_embeddings"); positions && *positions < m.context)
    throw InputError(fmt::format("{}: max_position_embeddings = {}, but the deck {} has model.context = {}: more "
                                 "positions than the model was made for", where, *positions, deck, m.context));
  if (const auto f = number("partial_rotary_factor"); f && *f != 1.0)
    throw InputError(fmt::format("{}: partial_rotary_factor = {}; Tessera's llama rotates every channel of a head (1)",
                                 where, *f));
  agree_number("rope_theta", number("rope_theta"), m.rope_theta, "model.rope_theta");
  if (j.contains("rope_scaling") && !j["rope_scaling"].is_null())
    throw InputError(fmt::format("{}: rope_scaling = {}; Tessera's llama has the plain rotary embedding (null)", where,
                                 j["rope_scaling"].dump()));
  if (j.contains("rope_parameters") && !j["rope_parameters"].is_null()) {
    const nlohmann::json& rope = j["rope_parameters"];
    if (!rope.is_object())
      throw InputError(fmt::format("{}: rope_parameters = {}; expected an object", where, rope.dump()));
    for (const auto& [key, value] : rope.items()) {
      if (key == "rope_theta") {
        if (!value.is_number())
          throw InputError(fmt::format("{}: rope_parameters.rope_theta is {}; expected a number", where, value.dump()));
        agree_number("rope_parameters.rope_theta", value.get<double>(), m.rope_theta, "model.rope_theta");
      } else if (!(key == "rope_type" && value == "default") && !(key == "partial_rotary_factor" && value == 1.0)) {
        throw InputError(fmt::format("{}: rope_parameters.{} = {}; Tessera's llama has the plain rotary embedding "
                                     "(rope_type \"default\")", where, key, value.dump()));
      }
    }
  }
  if (j.contains("hidden_act") && j["hidden_act"] != "silu")
    throw InputError(fmt::format("{}: hidden_act = {}; Tessera's llama has \"silu\" (SwiGLU)", where,
                                 j["hidden_act"].dump()));
  for (const char* key : {"attention_bias", "mlp_bias"})
    if (j.contains(key) && j[key] != false)
      throw InputError(fmt::format("{}: {} = {}; Tessera's llama has no biases (false)", where, key, j[key].dump()));
  if (j.contains("tie_word_embeddings") && j["tie_word_embeddings"].is_boolean() &&
      j["tie_word_embeddings"].get<bool>() != m.tie_embeddings)
    throw InputError(fmt::format("{}: tie_word_embeddings = {}, but the deck {} has model.tie_embeddings = {}", where,
                                 j["tie_word_embeddings"].get<bool>(), deck, m.tie_embeddings));
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

  std::unique_ptr<io::SafetensorsModel> file;
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
    file = std::make_unique<io::SafetensorsModel>(args.file);
    // Hugging Face's names: GPT2LMHeadModel's (`transformer.h.0...`) or GPT2Model's, as the
    // original GPT-2 weights are published (`h.0...`, no prefix); LlamaForCausalLM's
    // (`model.layers.0...`, `lm_head.weight`) or LlamaModel's (`layers.0...`, no prefix).
    const bool gpt = cfg.model.kind == ModelKind::gpt, llama = cfg.model.kind == ModelKind::llama;
    const bool lm_head = gpt && file->find("transformer.wte.weight") != nullptr;
    const bool bare = gpt && !lm_head && file->find("wte.weight") != nullptr && file->find("h.0.ln_1.weight") != nullptr;
    const bool hf_llama = llama && file->find("model.embed_tokens.weight") != nullptr;
    const bool bare_llama = llama && !hf_llama && file->find("embed_tokens.weight") != nullptr;
    map = tensor_map(cfg, logical_params(cfg, shape),
                     lm_head || bare ? Naming::hf_gpt2 : hf_llama || bare_llama ? Naming::hf_llama : Naming::torch);
    if (bare)
      for (TensorMapping& t : map) t.exported = t.exported.substr(std::string("transformer.").size());
    if (bare_llama)
      for (TensorMapping& t : map)
        if (t.exported.starts_with("model.")) t.exported = t.exported.substr(std::string("model.").size());
    if (lm_head || bare) check_hf_config(file->path(), cfg, shape);
    if (hf_llama || bare_llama) check_hf_llama_config(file->path(), cfg, shape);
    // Optimizer state, or the train state an --optimizer export of a stateless optimizer carries.
    const bool with_state =
        file->metadata().count(std::string(kMetaTrain) + "step") > 0 ||
        std::any_of(file->entries().begin(), file->entries().end(),
                    [](const io::SafetensorsEntry& e) { return e.name.starts_with("optimizer/"); });
    planned = plan(*file, map, cfg, with_state);
    assign_owners(planned, comm.size());
    state = with_state ? metadata_state(file->path(), file->metadata(), cfg) : fresh_state(cfg);
    norm = import_norm(*file, cfg, shape);
    values = read_planned(*file, planned, comm.rank());
    check_tied_head(*file, cfg, planned, values, comm.rank());
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
    const bool mine = planned[i].owner == comm.rank();
    slab.count = mine ? slab.shape : Shape(slab.shape.size(), 0);
    slab.data = mine ? values[i].data() : nullptr;
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
                             file->path(), args.out, describe_model(cfg, shape), args.deck.deck, map.size(),
                             step > 0 ? "its" : "zero", norm ? ", the fields' normalisation statistics" : "", step,
                             args.deck.deck, args.out, step > 0 ? "continues" : "fine-tunes")
              << std::flush;
  return 0;
}

}  // namespace tessera::cli
