// Reading a deck: TOML syntax, unknown names, types and ranges, then the combinations that do not
// depend on the world size (deck_checks.cpp). Every message is one line that says where, which
// key, what is wrong and what is allowed.
#include "core/deck.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <toml++/toml.h>

#include "core/deck_checks.hpp"
#include "core/deck_schema.hpp"
#include "core/error.hpp"
#include "core/utf8.hpp"

namespace tessera {
namespace {

using deck::KeySpec;
using deck::KeyType;
using deck::Value;

[[noreturn]] void fail(const std::string& where, std::string_view key, const std::string& what) {
  throw InputError(fmt::format("{}: {}: {}", where, key, what));
}

std::string at(const std::string& path, const toml::node& node) {
  return fmt::format("{}:{}", path, node.source().begin.line);
}

// --- Suggestions --------------------------------------------------------------------------

std::size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<std::size_t> row(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t diag = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

/// A typo of `want`: at most 2 edits (fewer than the word has letters).
bool is_typo(std::string_view got, std::string_view want) {
  const std::size_t d = edit_distance(got, want);
  return d <= 2 && d < got.size();
}

/// One name contains the other (at least 3 letters), e.g. "warmup" and "warmup_steps".
bool is_part(std::string_view got, std::string_view want) {
  if (got.size() < 3 || want.size() < 3) return false;
  return want.find(got) != std::string_view::npos || got.find(want) != std::string_view::npos;
}

/// "did you mean 'optimizer.lr'?" for an unknown key, or the keys of its section.
std::string key_hint(std::string_view section, std::string_view name) {
  const KeySpec* best = nullptr;
  std::size_t best_d = SIZE_MAX;
  for (const auto& k : deck::schema()) {
    if (k.section != section || !is_typo(name, k.name)) continue;
    const std::size_t d = edit_distance(name, k.name);
    if (d < best_d) best = &k, best_d = d;
  }
  for (const auto& k : deck::schema())  // the right name in another section
    if (!best && k.name == name) best = &k;
  for (const auto& k : deck::schema())
    if (!best && k.section == section && is_part(name, k.name)) best = &k;
  for (const auto& k : deck::schema())
    if (!best && k.section != section && edit_distance(name, k.name) <= 1) best = &k;
  if (best) return fmt::format("did you mean '{}'?", best->full_name());
  std::string keys;
  for (const auto& k : deck::schema())
    if (k.section == section) keys += fmt::format("{}{}", keys.empty() ? "" : ", ", k.name);
  return fmt::format("keys of [{}]: {}", section, keys);
}

std::string section_hint(std::string_view section) {
  for (auto s : deck::sections())
    if (is_typo(section, s) || is_part(section, s)) return fmt::format("did you mean [{}]?", s);
  std::string all;
  for (auto s : deck::sections()) all += fmt::format("{}[{}]", all.empty() ? "" : ", ", s);
  return "sections: " + all;
}

/// For a name outside any section ("seed = 1" at the top, or "--set seed=1").
std::string sectionless_hint(std::string_view name) {
  for (const auto& k : deck::schema())
    if (k.name == name) return fmt::format("did you mean '{}'?", k.full_name());
  return section_hint(name);
}

// --- Values -------------------------------------------------------------------------------

/// "a string \"128\"", "a float 128.0", "an array".
std::string describe(const toml::node& node) {
  std::ostringstream os;
  node.visit([&](const auto& n) {
    using N = std::remove_cvref_t<decltype(n)>;
    if constexpr (toml::is_table<N>) os << "a table";
    else if constexpr (toml::is_array<N>) os << "an array";
    else if constexpr (toml::is_string<N>) os << "a string " << deck::quote(n.get());
    else if constexpr (toml::is_integer<N>) os << "an integer " << n;
    else if constexpr (toml::is_floating_point<N>) os << "a float " << n;
    else if constexpr (toml::is_boolean<N>) os << "a boolean " << n;
    else os << "a date/time " << n;
  });
  return os.str();
}

[[noreturn]] void wrong_type(const std::string& where, const KeySpec& k, std::string_view expected,
                             const toml::node& got) {
  fail(where, k.full_name(),
       fmt::format("expected {}, got {}; allowed: {}", expected, describe(got), k.allowed()));
}

/// Where a node sits: "path:line" for the deck file, "--set k=v" for an override.
using Locate = std::function<std::string(const toml::node&)>;

std::int64_t read_integer(const std::string& where, const KeySpec& k, const toml::node& node,
                          std::string_view expected) {
  if (!node.is_integer()) wrong_type(where, k, expected, node);
  const std::int64_t v = node.as_integer()->get();
  if (v < k.int_min || v > k.int_max)
    fail(where, k.full_name(),
         fmt::format("{} does not fit (the limits are {} and {}); allowed: {}", v, k.int_min, k.int_max, k.allowed()));
  if (!deck::in_range(k.range, static_cast<double>(v)))
    fail(where, k.full_name(), fmt::format("{} is out of range; allowed: {}", v, k.allowed()));
  return v;
}

/// Type- and range-checks `node` for key `k`.
Value read_value(const Locate& locate, const KeySpec& k, const toml::node& node) {
  const std::string where = locate(node);
  switch (k.type) {
    case KeyType::integer: return read_integer(where, k, node, "an integer");
    case KeyType::floating: {
      double v = 0;
      if (node.is_floating_point()) v = node.as_floating_point()->get();
      else if (node.is_integer()) v = static_cast<double>(node.as_integer()->get());
      else wrong_type(where, k, "a float", node);
      if (!std::isfinite(v) || !deck::in_range(k.range, v))
        fail(where, k.full_name(),
             fmt::format("{} is out of range; allowed: {}", deck::format_value(k, v), k.allowed()));
      return v;
    }
    case KeyType::boolean:
      if (!node.is_boolean()) wrong_type(where, k, "true or false", node);
      return node.as_boolean()->get();
    case KeyType::string: {
      if (!node.is_string()) wrong_type(where, k, "a string", node);
      std::string v = node.as_string()->get();
      if (k.non_empty && v.empty())
        fail(where, k.full_name(), fmt::format("must not be empty; allowed: {}", k.allowed()));
      return v;
    }
    case KeyType::int_array: {
      if (!node.is_array()) wrong_type(where, k, "an array of integers", node);
      std::vector<std::int64_t> v;
      for (const auto& element : *node.as_array()) {
        v.push_back(read_integer(locate(element), k, element, "an array of integers"));
      }
      return v;
    }
    case KeyType::choice: {
      if (!node.is_string()) wrong_type(where, k, "a name", node);
      const std::string v = node.as_string()->get();
      if (std::find(k.choices.begin(), k.choices.end(), v) != k.choices.end()) return v;
      std::string hint;
      for (auto c : k.choices)
        if (hint.empty() && (is_typo(v, c) || is_part(v, c))) hint = fmt::format(" (did you mean \"{}\"?)", c);
      fail(where, k.full_name(),
           fmt::format("unknown value \"{}\"; allowed: {}{}", v, k.allowed(), hint));
    }
  }
  return {};
}

// --- The deck file ------------------------------------------------------------------------

toml::table parse_deck_text(const std::string& text, const std::string& path) {
  try {
    return toml::parse(text, path);
  } catch (const toml::parse_error& e) {
    throw InputError(fmt::format("{}:{}:{}: invalid TOML: {}", path, e.source().begin.line,
                                 e.source().begin.column, e.description()));
  }
}

toml::table parse_deck(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) throw InputError(path + ": cannot open deck file");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError(path + ": cannot open deck file");
  std::ostringstream text;
  text << in.rdbuf();
  return parse_deck_text(text.str(), path);
}

/// A key-value pair or an unknown section of the deck, in file order.
struct Entry {
  toml::source_position pos;
  std::string section;  ///< empty: a key outside any section
  std::string name;     ///< empty: the section itself is unknown
  const toml::node* node;
};

void apply_file(Config& cfg, const toml::table& root, const std::string& path, deck::Origins& origins) {
  // Gather, then sort by position so that the first error reported is the first in the file.
  std::vector<Entry> entries;
  for (const auto& [key, node] : root) {
    const std::string section(key.str());
    if (!node.is_table()) {
      entries.push_back({node.source().begin, "", section, &node});
    } else if (std::find(deck::sections().begin(), deck::sections().end(), section) == deck::sections().end()) {
      entries.push_back({node.source().begin, section, "", &node});
    } else {
      for (const auto& [name, value] : *node.as_table())
        entries.push_back({value.source().begin, section, std::string(name.str()), &value});
    }
  }
  std::stable_sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
    return std::pair(a.pos.line, a.pos.column) < std::pair(b.pos.line, b.pos.column);
  });

  const Locate locate = [&path](const toml::node& n) { return at(path, n); };
  for (const auto& e : entries) {
    const std::string where = at(path, *e.node);
    if (e.section.empty()) {
      const bool is_section = std::find(deck::sections().begin(), deck::sections().end(), e.name) !=
                              deck::sections().end();
      if (is_section)
        fail(where, e.name, fmt::format("expected a table [{}], got {}", e.name, describe(*e.node)));
      fail(where, e.name, "key outside any section; " + sectionless_hint(e.name));
    }
    if (e.name.empty()) fail(where, e.section, "unknown section; " + section_hint(e.section));
    const KeySpec* k = deck::find_key(e.section, e.name);
    if (!k) fail(where, e.section + "." + e.name, "unknown key; " + key_hint(e.section, e.name));
    k->set(cfg, read_value(locate, *k, *e.node));
    origins[k->full_name()] = where;
  }
}

std::string_view trim(std::string_view s) {
  const auto b = s.find_first_not_of(" \t");
  if (b == std::string_view::npos) return {};
  return s.substr(b, s.find_last_not_of(" \t") - b + 1);
}

/// One "--set section.key=value".
void apply_override(Config& cfg, const std::string& text, deck::Origins& origins) {
  if (const std::optional<std::size_t> bad = first_invalid_utf8(text))
    throw InputError(fmt::format("--set {}...: byte {} is not UTF-8 (a deck and every --set value are UTF-8 text)",
                                 text.substr(0, *bad), *bad + 1));
  const std::string where = "--set " + text;
  const auto eq = text.find('=');
  if (eq == std::string::npos)
    throw InputError(where + ": expected section.key=value, e.g. --set optimizer.lr=0.1");
  const std::string name(trim(std::string_view(text).substr(0, eq)));
  const std::string value_text(trim(std::string_view(text).substr(eq + 1)));
  const auto dot = name.find('.');
  if (dot == std::string::npos) fail(where, name, "not a section.key name; " + sectionless_hint(name));
  const std::string section = name.substr(0, dot);
  const std::string key = name.substr(dot + 1);
  if (std::find(deck::sections().begin(), deck::sections().end(), section) == deck::sections().end())
    fail(where, name, fmt::format("unknown section '{}'; {}", section, section_hint(section)));
  const KeySpec* k = deck::find_key(section, key);
  if (!k) fail(where, name, "unknown key; " + key_hint(section, key));

  // The value as TOML, else as a bare string; a string key takes unquoted text as it is.
  toml::table parsed;
  bool is_toml = false;
  try {
    parsed = toml::parse("v = " + value_text);
    is_toml = parsed.size() == 1 && parsed.contains("v");
  } catch (const toml::parse_error&) {
  }
  const toml::value<std::string> bare(value_text);
  const toml::node* node = &bare;
  if (is_toml && !(k->type == KeyType::string && !parsed["v"].is_string())) node = parsed.get("v");
  k->set(cfg, read_value([&where](const toml::node&) { return where; }, *k, *node));
  origins[k->full_name()] = where;
}

template <class E, std::size_t N>
std::string_view name_in(const deck::Choice<E> (&table)[N], E v) {
  for (const auto& c : table)
    if (c.value == v) return c.name;
  return "?";
}

}  // namespace

Config load_deck(const std::string& path, const std::vector<std::string>& overrides) {
  Config cfg;
  cfg.deck_path = path;
  deck::Origins origins;
  apply_file(cfg, parse_deck(path), path, origins);
  for (const auto& o : overrides) apply_override(cfg, o, origins);
  deck::check_combinations(cfg, origins);
  cfg.resolved_toml = to_toml(cfg);
  return cfg;
}

Config load_deck_text(const std::string& text, const std::string& name) {
  Config cfg;
  cfg.deck_path = name;
  deck::Origins origins;
  apply_file(cfg, parse_deck_text(text, name), name, origins);
  deck::check_combinations(cfg, origins);
  cfg.resolved_toml = to_toml(cfg);
  return cfg;
}

std::string to_toml(const Config& cfg) {
  std::string out;
  std::string_view section;
  for (const auto& k : deck::schema()) {
    if (k.section != section) {
      out += fmt::format("{}[{}]\n", section.empty() ? "" : "\n", k.section);
      section = k.section;
    }
    out += fmt::format("{} = {}\n", k.name, deck::format_value(k, k.get(cfg)));
  }
  return out;
}

std::vector<std::string> deck_keys() {
  std::vector<std::string> keys;
  for (const auto& k : deck::schema()) keys.push_back(k.full_name());
  return keys;
}

std::string_view to_string(ModelKind v) { return name_in(deck::kModelKinds, v); }
std::string_view to_string(Precision v) { return name_in(deck::kPrecisions, v); }
std::string_view to_string(Activation v) { return name_in(deck::kActivations, v); }
std::string_view to_string(GeluApproximate v) { return name_in(deck::kGeluApproximates, v); }
std::string_view to_string(LossKind v) { return name_in(deck::kLossKinds, v); }
std::string_view to_string(FieldNormalize v) { return name_in(deck::kFieldNormalize, v); }
std::string_view to_string(OptimizerKind v) { return name_in(deck::kOptimizerKinds, v); }
std::string_view to_string(OptimizerOffload v) { return name_in(deck::kOptimizerOffloads, v); }
std::string_view to_string(ScheduleKind v) { return name_in(deck::kScheduleKinds, v); }
std::string_view to_string(PipelineSchedule v) { return name_in(deck::kPipelineSchedules, v); }
std::string_view to_string(ZeroGroup v) { return name_in(deck::kZeroGroups, v); }
std::string_view to_string(ContextComm v) { return name_in(deck::kContextComms, v); }
std::string_view to_string(AllreduceAlgorithm v) { return name_in(deck::kAllreduceAlgorithms, v); }
std::string_view to_string(CommBackend v) { return name_in(deck::kCommBackends, v); }
std::string_view to_string(ReduceDtype v) { return name_in(deck::kReduceDtypes, v); }

}  // namespace tessera
