#include "cli/export_state.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <limits>

#include <nlohmann/json.hpp>

#include "core/deck.hpp"
#include "core/error.hpp"
#include "optim/optimizer.hpp"
#include "train/field_norm.hpp"

namespace tessera::cli {

namespace {

// The step count a checkpoint may claim at most (as the checkpointer's limit).
constexpr std::int64_t kMaxStep = std::int64_t{1} << 48;
constexpr double kMaxLossScale = 16777216.0;  // 2^24

const char* const kIntegerTrainKeys[] = {"step", "epoch", "batch_in_epoch", "samples_seen",
                                         "loss_scale_good_steps", "skipped_steps"};

std::string optimizer_kind(const Config& cfg) { return Optimizer(cfg.optimizer, 0).kind_name(); }

std::string text_of(const std::string& file, const std::map<std::string, std::string>& metadata,
                    const std::string& key) {
  const auto it = metadata.find(key);
  if (it == metadata.end())
    throw InputError(fmt::format("{}: __metadata__ has no {}; an export with optimizer state (--optimizer) "
                                 "records where training stood", file, key));
  return it->second;
}

std::int64_t integer_in(const std::string& file, const std::map<std::string, std::string>& metadata,
                        const std::string& key, std::int64_t lo, std::int64_t hi) {
  const std::string text = text_of(file, metadata, key);
  std::int64_t v = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || end != text.data() + text.size() || v < lo || v > hi)
    throw InputError(fmt::format("{}: __metadata__ {} is \"{}\", expected an integer from {} to {}", file, key,
                                 text.substr(0, 40), lo, hi));
  return v;
}

double loss_scale(const std::string& file, const std::string& key, const std::string& text) {
  char* end = nullptr;
  errno = 0;
  const double scale = std::strtod(text.c_str(), &end);
  if (errno != 0 || end != text.c_str() + text.size() || !(scale >= 1.0 && scale <= kMaxLossScale))
    throw InputError(fmt::format("{}: __metadata__ {} is \"{}\", expected a number from 1 to 2^24", file, key,
                                 text.substr(0, 40)));
  return scale;
}

}  // namespace

std::map<std::string, std::string> export_metadata(const io::CheckpointFile& file, const Config& cfg,
                                                   Naming naming) {
  const auto root = file.root_attrs();
  const auto step = root.find("step");
  return {{"format", "pt"},
          {"tessera.kind", std::string(to_string(cfg.model.kind))},
          {"tessera.names", to_string(naming)},
          {"tessera.checkpoint", file.path()},
          {kMetaStep, step != root.end() ? io::to_string(step->second) : std::string("unknown")},
          {"tessera.deck", cfg.resolved_toml}};
}

std::vector<std::string> optimizer_states(const io::CheckpointFile& file, const Config& cfg,
                                          const std::vector<TensorMapping>& map,
                                          std::map<std::string, std::string>& metadata) {
  const Optimizer opt(cfg.optimizer, 0);
  const auto oattrs = file.group_attrs("optimizer");
  const auto kind = oattrs.find("kind");
  if (kind == oattrs.end() || io::to_string(kind->second) != opt.kind_name())
    throw InputError(fmt::format("{}: /optimizer kind is {}, but its deck says optimizer.kind = \"{}\"", file.path(),
                                 kind == oattrs.end() ? "missing" : "\"" + io::to_string(kind->second) + "\"",
                                 opt.kind_name()));
  for (const std::string& state : opt.state_names())
    for (const TensorMapping& t : map) {
      const std::string ds = fmt::format("optimizer/{}/{}", t.name, state);
      if (!file.has(ds) || file.shape(ds) != t.shape)
        throw InputError(fmt::format("{}: {} is missing or not of shape [{}]; the {} optimizer keeps it",
                                     file.path(), ds, fmt::join(t.shape, ","), opt.kind_name()));
    }
  for (const auto& [key, value] : oattrs) metadata[kMetaOptimizer + key] = io::to_string(value);
  for (const auto& [key, value] : file.group_attrs("train")) metadata[kMetaTrain + key] = io::to_string(value);
  return opt.state_names();
}

namespace {

// The statistics' names in the metadata, in kFieldNormTensors' order.
std::string norm_key(std::size_t i) {
  const std::string tensor = kFieldNormTensors[i];
  return kMetaNorm + tensor.substr(tensor.find('/') + 1);
}

}  // namespace

void add_norm_metadata(std::map<std::string, std::string>& metadata, const nn::FieldNorm& norm) {
  const FieldNormValues values = field_norm_values(norm);
  for (std::size_t i = 0; i < values.size(); ++i)
    metadata[norm_key(i)] = fmt::format("[{:.9g}]", fmt::join(values[i], ", "));
  metadata[std::string(kMetaNorm) + "rule"] = kFieldNormRule;
}

std::optional<nn::FieldNorm> metadata_norm(const std::string& file, const std::map<std::string, std::string>& metadata,
                                           int in_channels, int out_channels) {
  std::size_t present = 0;
  for (std::size_t i = 0; i < kFieldNormTensors.size(); ++i) present += metadata.count(norm_key(i));
  if (present == 0) return std::nullopt;
  FieldNormValues values;
  for (std::size_t i = 0; i < kFieldNormTensors.size(); ++i) {
    const std::string key = norm_key(i);
    if (!metadata.count(key))
      throw InputError(fmt::format("{}: __metadata__ holds {} of the 4 statistics {}*, not {}; an export holds "
                                   "all or none", file, present, kMetaNorm, key));
    const std::string& text = metadata.at(key);
    const nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
    const bool numbers = j.is_array() && std::all_of(j.begin(), j.end(), [](const nlohmann::json& v) {
      return v.is_number() && std::abs(v.get<double>()) <= std::numeric_limits<float>::max();
    });
    if (!numbers)
      throw InputError(fmt::format("{}: __metadata__ {} is \"{}\", expected a list of float32 numbers, one per "
                                   "channel", file, key, text.substr(0, 40)));
    for (const nlohmann::json& v : j) values[i].push_back(static_cast<float>(v.get<double>()));
  }
  const nn::FieldNorm norm = field_norm_of(values);
  check_field_norm(norm, in_channels, out_channels, fmt::format("{}: __metadata__ {}*", file, kMetaNorm));
  return norm;
}

std::string optimizer_name(const std::string& exported, const std::string& state) {
  return fmt::format("optimizer/{}/{}", exported, state);
}

StoredState fresh_state(const Config& cfg) {
  StoredState s;
  s.optimizer = {{"kind", optimizer_kind(cfg)}, {"step", std::int64_t{0}}};
  for (const char* key : kIntegerTrainKeys) s.train[key] = std::int64_t{0};
  s.train["loss_scale"] = cfg.train.precision == Precision::fp16 ? cfg.train.loss_scale : 1.0;
  return s;
}

StoredState metadata_state(const std::string& file, const std::map<std::string, std::string>& metadata,
                           const Config& cfg) {
  StoredState s;
  const std::string kind = text_of(file, metadata, std::string(kMetaOptimizer) + "kind");
  if (kind != optimizer_kind(cfg))
    throw InputError(fmt::format("{}: holds {} optimizer state, but the deck says optimizer.kind = \"{}\"", file,
                                 kind.substr(0, 40), optimizer_kind(cfg)));
  const auto train = [&](const char* key, std::int64_t lo, std::int64_t hi) {
    const std::int64_t v = integer_in(file, metadata, std::string(kMetaTrain) + key, lo, hi);
    s.train[key] = v;
    return v;
  };
  // The ranges a resume checks (train/checkpointer.cpp).
  const std::int64_t step = train("step", 0, kMaxStep);
  train("epoch", 0, step);
  train("batch_in_epoch", 0, kMaxStep);
  train("samples_seen", step, std::numeric_limits<std::int64_t>::max());
  // Checkpoints from before mixed precision have no loss-scale state: a fresh run's serves.
  const std::string scale_key = std::string(kMetaTrain) + "loss_scale";
  if (!metadata.count(scale_key)) {
    const StoredState fresh = fresh_state(cfg);
    for (const char* key : {"loss_scale", "loss_scale_good_steps", "skipped_steps"}) s.train[key] = fresh.train.at(key);
  } else {
    train("loss_scale_good_steps", 0, step);
    train("skipped_steps", 0, step);
    s.train["loss_scale"] = loss_scale(file, scale_key, text_of(file, metadata, scale_key));
  }
  s.optimizer = {{"kind", kind},
                 {"step", integer_in(file, metadata, std::string(kMetaOptimizer) + "step", 0, step)}};
  return s;
}

}  // namespace tessera::cli
