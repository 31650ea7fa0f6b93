#include "io/bpe_tokenizer.hpp"

#include <fmt/format.h>
#include <unicode/bytestream.h>
#include <unicode/normalizer2.h>

#include <algorithm>
#include <array>
#include <nlohmann/json.hpp>
#include <queue>
#include <unordered_map>

#include "core/error.hpp"
#include "io/pre_tokenizer.hpp"
#include "io/utf8.hpp"

namespace tessera::io {

namespace {

using nlohmann::json;

// GPT-2's byte-to-unicode map: the printable bytes ('!'..'~', '¡'..'¬', '®'..'ÿ') stand for
// themselves, the other 68 for U+0100 upwards in byte order, so every token is printable text.
std::array<char32_t, 256> byte_to_char() {
  std::array<char32_t, 256> map{};
  char32_t next = 256;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    map[std::size_t(b)] = printable ? char32_t(b) : next++;
  }
  return map;
}

// A token's text (byte-level symbols) as the bytes it stands for; false when a character is not
// one of the 256 symbols (an added token's plain text, say).
bool symbols_to_bytes(std::string_view symbols, std::string& bytes) {
  static const std::unordered_map<char32_t, std::uint8_t> inverse = [] {
    std::unordered_map<char32_t, std::uint8_t> m;
    const auto map = byte_to_char();
    for (int b = 0; b < 256; ++b) m[map[std::size_t(b)]] = std::uint8_t(b);
    return m;
  }();
  bytes.clear();
  if (utf8::first_invalid(symbols)) return false;
  for (std::size_t i = 0, n = 0; i < symbols.size(); i += n) {
    const auto it = inverse.find(utf8::decode(symbols, i, n));
    if (it == inverse.end()) return false;
    bytes.push_back(static_cast<char>(it->second));
  }
  return true;
}

std::uint64_t pair_key(std::int32_t a, std::int32_t b) {
  return std::uint64_t(std::uint32_t(a)) << 32 | std::uint32_t(b);
}

struct Merge {
  std::int32_t rank, id;
};

struct AddedToken {
  std::string content;
  std::int32_t id;
  bool lstrip, rstrip;
};

json parse_json(std::string_view text, const std::string& path) {
  try {
    return json::parse(text.begin(), text.end());
  } catch (const json::exception& e) {
    throw InputError(fmt::format("{}: not valid JSON: {}", path, e.what()));
  }
}

const json& member(const json& object, const char* key, const std::string& where) {
  if (!object.is_object() || !object.contains(key))
    throw InputError(fmt::format("{}: no \"{}\"", where, key));
  return object.at(key);
}

std::string string_or(const json& object, const char* key, const std::string& fallback) {
  if (!object.is_object() || !object.contains(key) || object.at(key).is_null()) return fallback;
  if (!object.at(key).is_string()) throw InputError(fmt::format("\"{}\" is not a string", key));
  return object.at(key).get<std::string>();
}

bool bool_or(const json& object, const char* key, bool fallback) {
  if (!object.is_object() || !object.contains(key) || object.at(key).is_null()) return fallback;
  if (!object.at(key).is_boolean()) throw InputError(fmt::format("\"{}\" is not true or false", key));
  return object.at(key).get<bool>();
}

}  // namespace

struct BpeTokenizer::Impl {
  std::string path;                                   // for messages
  std::unordered_map<std::string, std::int32_t> vocab;  // token bytes -> id (byte-level tokens)
  std::unordered_map<std::uint64_t, Merge> merges;
  std::array<std::int32_t, 256> byte_id{};
  std::vector<std::string> id_bytes;  // id -> bytes; empty: no token
  std::vector<bool> id_known;
  std::vector<AddedToken> added;
  std::array<std::vector<std::size_t>, 256> added_by_first;  // indices, longest first
  PreTokenizer pre;
  const icu::Normalizer2* nfc = nullptr;
  bool ignore_merges = false;
  std::int64_t size = 0;

  // Per-object scratch (encoding is not thread-safe): pieces and the words already merged.
  mutable std::vector<PreTokenizer::Piece> pieces;
  mutable std::unordered_map<std::string, std::vector<std::int32_t>> cache;
  mutable std::string word, normalized;

  void set_token(std::int32_t id, std::string bytes) {
    if (std::size_t(id) >= id_bytes.size()) {
      id_bytes.resize(std::size_t(id) + 1);
      id_known.resize(std::size_t(id) + 1);
    }
    id_bytes[std::size_t(id)] = std::move(bytes);
    id_known[std::size_t(id)] = true;
    size = std::max<std::int64_t>(size, std::int64_t(id) + 1);
  }

  void read_vocab(const json& v, const std::string& where) {
    if (!v.is_object()) throw InputError(fmt::format("{}: expected an object of token: id", where));
    std::string bytes;
    for (const auto& [key, value] : v.items()) {
      if (!value.is_number_integer() || value.get<std::int64_t>() < 0 || value.get<std::int64_t>() >= (1ll << 31) - 1)
        throw InputError(fmt::format("{}: token \"{}\" has id {}, expected an integer in [0, 2^31 - 1)", where, key,
                                     value.dump()));
      const auto id = value.get<std::int32_t>();
      if (std::size_t(id) < id_known.size() && id_known[std::size_t(id)])
        throw InputError(fmt::format("{}: id {} is given to two tokens (one is \"{}\")", where, id, key));
      if (symbols_to_bytes(key, bytes)) vocab.emplace(bytes, id);
      else bytes = key;  // not byte-level text: decodes as itself
      set_token(id, bytes);
    }
    const auto map = byte_to_char();
    for (int b = 0; b < 256; ++b) {
      const auto it = vocab.find(std::string(1, static_cast<char>(b)));
      if (it == vocab.end()) {
        std::string symbol;
        utf8::append(symbol, map[std::size_t(b)]);
        throw InputError(fmt::format("{}: no token for byte 0x{:02x} (\"{}\"); a byte-level BPE has all 256", where,
                                     b, symbol));
      }
      byte_id[std::size_t(b)] = it->second;
    }
  }

  // One merge "a b" of rank `rank`; where names it in errors.
  void add_merge(std::string_view a, std::string_view b, const std::string& where) {
    std::string left, right;
    const auto id_of = [&](std::string_view symbols, std::string& bytes) {
      const auto it = symbols_to_bytes(symbols, bytes) ? vocab.find(bytes) : vocab.end();
      if (it == vocab.end())
        throw InputError(fmt::format("{}: \"{}\" is not in the vocabulary", where, symbols));
      return it->second;
    };
    const std::int32_t ia = id_of(a, left), ib = id_of(b, right);
    const auto merged = vocab.find(left + right);
    if (merged == vocab.end())
      throw InputError(fmt::format("{}: the merge of \"{}\" and \"{}\" makes \"{}{}\", which is not in the vocabulary",
                                   where, a, b, a, b));
    merges.emplace(pair_key(ia, ib), Merge{std::int32_t(merges.size()), merged->second});
  }

  void add_token(AddedToken t) {
    set_token(t.id, t.content);
    const std::size_t index = added.size();
    auto& list = added_by_first[static_cast<std::uint8_t>(t.content[0])];
    added.push_back(std::move(t));
    list.push_back(index);
    std::stable_sort(list.begin(), list.end(),
                     [&](std::size_t x, std::size_t y) { return added[x].content.size() > added[y].content.size(); });
  }

  // The leftmost-longest added token in text[from, ...): its index and [start, stop) widened
  // by lstrip (not before from) and rstrip; false when there is none.
  bool next_added(std::string_view text, std::size_t from, std::size_t& index, std::size_t& start,
                  std::size_t& stop) const {
    if (added.empty()) return false;
    for (std::size_t p = from; p < text.size(); ++p) {
      const auto& list = added_by_first[static_cast<std::uint8_t>(text[p])];
      for (const std::size_t i : list) {
        const std::string& c = added[i].content;
        if (text.compare(p, c.size(), c) != 0) continue;
        index = i;
        start = p;
        stop = p + c.size();
        if (added[i].lstrip) {
          // Back over whitespace: find the start of the whitespace run that ends at p.
          std::size_t s = from, n = 0;
          for (std::size_t q = from; q < p; q += n) {
            const char32_t ch = utf8::decode(text, q, n);
            if (!utf8::is_white_space(ch)) s = q + n;
          }
          start = s;
        }
        if (added[i].rstrip) {
          std::size_t n = 0;
          while (stop < text.size() && utf8::is_white_space(utf8::decode(text, stop, n))) stop += n;
        }
        return true;
      }
    }
    return false;
  }

  // BPE on one pre-token (bytes), ids appended to out.
  void merge_word(std::string_view bytes, std::vector<std::int32_t>& out) const {
    if (ignore_merges) {
      const auto whole = vocab.find(std::string(bytes));
      if (whole != vocab.end()) {
        out.push_back(whole->second);
        return;
      }
    }
    const std::string key(bytes);
    if (const auto hit = cache.find(key); hit != cache.end()) {
      out.insert(out.end(), hit->second.begin(), hit->second.end());
      return;
    }
    // Symbols as a linked list; a heap of candidate merges by (rank, position), the lowest
    // first, as Hugging Face's Word::merge_all.
    const std::size_t n = bytes.size();
    std::vector<std::int32_t> id(n);
    std::vector<std::int64_t> prev(n), next(n);
    for (std::size_t i = 0; i < n; ++i) {
      id[i] = byte_id[static_cast<std::uint8_t>(bytes[i])];
      prev[i] = std::int64_t(i) - 1;
      next[i] = std::int64_t(i) + 1;
    }
    using Candidate = std::pair<std::int32_t, std::int64_t>;  // rank, position
    std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> heap;
    const auto consider = [&](std::int64_t i) {
      if (i < 0 || next[std::size_t(i)] >= std::int64_t(n)) return;
      const auto m = merges.find(pair_key(id[std::size_t(i)], id[std::size_t(next[std::size_t(i)])]));
      if (m != merges.end()) heap.emplace(m->second.rank, i);
    };
    for (std::size_t i = 0; i + 1 < n; ++i) consider(std::int64_t(i));
    std::vector<bool> gone(n, false);
    while (!heap.empty()) {
      const auto [rank, i] = heap.top();
      heap.pop();
      const auto u = std::size_t(i);
      if (gone[u] || next[u] >= std::int64_t(n)) continue;
      const auto j = std::size_t(next[u]);
      const auto m = merges.find(pair_key(id[u], id[j]));
      if (m == merges.end() || m->second.rank != rank) continue;  // stale: the pair changed
      id[u] = m->second.id;
      gone[j] = true;
      next[u] = next[j];
      if (next[j] < std::int64_t(n)) prev[std::size_t(next[j])] = i;
      consider(prev[u]);
      consider(i);
    }
    std::vector<std::int32_t> result;
    for (std::size_t i = 0; i < n; ++i)
      if (!gone[i]) result.push_back(id[i]);
    out.insert(out.end(), result.begin(), result.end());
    if (cache.size() >= (std::size_t{1} << 20)) cache.clear();
    cache.emplace(key, std::move(result));
  }

  std::string_view normalize(std::string_view text, std::string& buffer) const {
    if (!nfc) return text;
    UErrorCode status = U_ZERO_ERROR;
    if (nfc->isNormalizedUTF8(icu::StringPiece(text.data(), std::int32_t(text.size())), status) && U_SUCCESS(status))
      return text;
    status = U_ZERO_ERROR;
    icu::StringByteSink<std::string> sink(&buffer);
    nfc->normalizeUTF8(0, icu::StringPiece(text.data(), std::int32_t(text.size())), sink, nullptr, status);
    if (U_FAILURE(status)) throw std::runtime_error(fmt::format("ICU NFC failed: {}", u_errorName(status)));
    return buffer;
  }

  // Encodes segment (text between added tokens), stopping at cut (<= segment.size()); false
  // when a pre-token crosses cut.
  bool encode_segment(std::string_view segment, std::size_t cut, std::vector<std::int32_t>& out) const {
    std::string_view text = segment;
    if (nfc) {
      // NFC of each side of the cut apart: equal to the NFC of the whole at the cuts allowed.
      std::string head, tail;
      const std::string_view h = normalize(segment.substr(0, cut), head);
      const std::string_view t = normalize(segment.substr(cut), tail);
      normalized.assign(h);
      cut = normalized.size();
      normalized.append(t);
      text = normalized;
    }
    pieces.clear();
    pre.split(text, pieces);
    for (const auto& p : pieces) {
      if (p.begin >= cut) break;
      if (p.end > cut) return false;
      if (p.space) {
        word.assign(1, ' ');
        word.append(text.substr(p.begin, p.end - p.begin));
        merge_word(word, out);
      } else {
        merge_word(text.substr(p.begin, p.end - p.begin), out);
      }
    }
    return true;
  }
};

BpeTokenizer::BpeTokenizer() : impl_(std::make_unique<Impl>()) {}
BpeTokenizer::~BpeTokenizer() = default;
BpeTokenizer::BpeTokenizer(BpeTokenizer&&) noexcept = default;
BpeTokenizer& BpeTokenizer::operator=(BpeTokenizer&&) noexcept = default;

namespace {

// Adds the steps of a tokenizer.json pre_tokenizer to pre; returns whether a ByteLevel was among them.
bool add_pre_tokenizer(PreTokenizer& pre, const json& spec, const std::string& where) {
  const std::string type = string_or(spec, "type", "");
  if (type == "Sequence") {
    const json& steps = member(spec, "pretokenizers", where);
    if (!steps.is_array()) throw InputError(fmt::format("{}.pretokenizers: expected a list", where));
    bool byte_level = false;
    for (std::size_t i = 0; i < steps.size(); ++i)
      byte_level |= add_pre_tokenizer(pre, steps[i], fmt::format("{}.pretokenizers[{}]", where, i));
    return byte_level;
  }
  if (type == "ByteLevel") {
    pre.add_stage(bool_or(spec, "use_regex", true) ? kGpt2Pattern : "", bool_or(spec, "add_prefix_space", true), where);
    return true;
  }
  if (type == "Split") {
    const json& pattern = member(spec, "pattern", where);
    const std::string behavior = string_or(spec, "behavior", "");
    if (behavior != "Isolated")
      throw InputError(fmt::format("{}: Split behavior \"{}\" is not supported (only \"Isolated\")", where, behavior));
    if (bool_or(spec, "invert", false)) throw InputError(fmt::format("{}: Split with invert is not supported", where));
    if (pattern.contains("Regex")) {
      pre.add_stage(string_or(pattern, "Regex", ""), false, where + ".pattern.Regex");
    } else {
      // A literal: every character escaped.
      std::string escaped;
      for (const char c : string_or(pattern, "String", ""))
        escaped += std::isalnum(static_cast<unsigned char>(c)) || (static_cast<unsigned char>(c) & 0x80)
                       ? std::string(1, c)
                       : std::string{'\\', c};
      if (escaped.empty()) throw InputError(fmt::format("{}.pattern: expected \"Regex\" or a non-empty \"String\"", where));
      pre.add_stage(escaped, false, where + ".pattern.String");
    }
    return false;
  }
  throw InputError(fmt::format("{}: pre-tokenizer type \"{}\" is not supported (ByteLevel, Split, Sequence)", where,
                               type.empty() ? spec.dump() : type));
}

}  // namespace

BpeTokenizer BpeTokenizer::from_json(std::string_view text, const std::string& path) {
  BpeTokenizer t;
  Impl& m = *t.impl_;
  m.path = path;
  const json doc = parse_json(text, path);
  try {
    const json& model = member(doc, "model", path);
    const std::string type = string_or(model, "type", "BPE");
    if (type != "BPE")
      throw InputError(fmt::format("{}: model type \"{}\" is not supported; tessera reads byte-level BPE tokenizers "
                                   "(GPT-2, Llama 3, Qwen2)", path, type));
    if (!model.value("dropout", json()).is_null() && model.at("dropout").get<double>() != 0.0)
      throw InputError(fmt::format("{}: model.dropout is set; BPE dropout is for training, not for preparing data", path));
    if (!string_or(model, "continuing_subword_prefix", "").empty() || !string_or(model, "end_of_word_suffix", "").empty())
      throw InputError(fmt::format("{}: model.continuing_subword_prefix or end_of_word_suffix is set; a byte-level BPE "
                                   "has neither", path));
    if (bool_or(model, "byte_fallback", false))
      throw InputError(fmt::format("{}: model.byte_fallback is true: not a byte-level BPE (a SentencePiece-style one, "
                                   "as Llama 2's), which tessera does not read", path));
    m.ignore_merges = bool_or(model, "ignore_merges", false);
    m.read_vocab(member(model, "vocab", path + ": model"), path + ": model.vocab");
    const json& merges = member(model, "merges", path + ": model");
    if (!merges.is_array()) throw InputError(fmt::format("{}: model.merges: expected a list", path));
    for (std::size_t i = 0; i < merges.size(); ++i) {
      const std::string where = fmt::format("{}: model.merges[{}]", path, i);
      const json& e = merges[i];
      if (e.is_string()) {
        const std::string s = e.get<std::string>();
        const auto space = s.find(' ');
        if (space == std::string::npos || s.find(' ', space + 1) != std::string::npos)
          throw InputError(fmt::format("{}: \"{}\" is not two tokens separated by one space", where, s));
        m.add_merge(std::string_view(s).substr(0, space), std::string_view(s).substr(space + 1), where);
      } else if (e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string()) {
        m.add_merge(e[0].get<std::string>(), e[1].get<std::string>(), where);
      } else {
        throw InputError(fmt::format("{}: {} is neither \"a b\" nor [\"a\", \"b\"]", where, e.dump()));
      }
    }
    const json normalizer = doc.value("normalizer", json());
    if (!normalizer.is_null()) {
      const std::string kind = string_or(normalizer, "type", "");
      if (kind != "NFC")
        throw InputError(fmt::format("{}: normalizer \"{}\" is not supported (null or NFC)", path,
                                     kind.empty() ? normalizer.dump() : kind));
      UErrorCode status = U_ZERO_ERROR;
      m.nfc = icu::Normalizer2::getNFCInstance(status);
      if (U_FAILURE(status)) throw std::runtime_error(fmt::format("ICU has no NFC: {}", u_errorName(status)));
    }
    const json pre = doc.value("pre_tokenizer", json());
    if (pre.is_null() || !add_pre_tokenizer(m.pre, pre, path + ": pre_tokenizer"))
      throw InputError(fmt::format("{}: the pre_tokenizer has no ByteLevel step: not a byte-level BPE", path));
    const json decoder = doc.value("decoder", json());
    if (!decoder.is_null() && string_or(decoder, "type", "") != "ByteLevel")
      throw InputError(fmt::format("{}: decoder \"{}\" is not supported (ByteLevel or null)", path,
                                   string_or(decoder, "type", decoder.dump())));
    const json added = doc.value("added_tokens", json::array());
    for (std::size_t i = 0; i < added.size(); ++i) {
      const std::string where = fmt::format("{}: added_tokens[{}]", path, i);
      const json& a = added[i];
      const std::string content = string_or(a, "content", "");
      const json& id = member(a, "id", where);
      if (content.empty() || !id.is_number_integer() || id.get<std::int64_t>() < 0 || id.get<std::int64_t>() >= (1ll << 31) - 1)
        throw InputError(fmt::format("{}: expected a non-empty \"content\" and an \"id\" in [0, 2^31 - 1)", where));
      if (bool_or(a, "single_word", false))
        throw InputError(fmt::format("{}: single_word tokens are not supported", where));
      if (utf8::first_invalid(content)) throw InputError(fmt::format("{}: content is not UTF-8", where));
      m.add_token({content, id.get<std::int32_t>(), bool_or(a, "lstrip", false), bool_or(a, "rstrip", false)});
    }
  } catch (const InputError& e) {
    const std::string what = e.what();
    if (what.rfind(path, 0) == 0) throw;
    throw InputError(fmt::format("{}: {}", path, what));
  } catch (const json::exception& e) {
    throw InputError(fmt::format("{}: {}", path, e.what()));
  }
  return t;
}

BpeTokenizer BpeTokenizer::from_vocab_merges(std::string_view vocab_json, std::string_view merges_txt,
                                             const std::string& vocab_path, const std::string& merges_path) {
  BpeTokenizer t;
  Impl& m = *t.impl_;
  m.path = vocab_path;
  m.read_vocab(parse_json(vocab_json, vocab_path), vocab_path);
  std::size_t line = 0, at = 0;
  while (at < merges_txt.size()) {
    std::size_t end = merges_txt.find('\n', at);
    if (end == std::string_view::npos) end = merges_txt.size();
    std::string_view s = merges_txt.substr(at, end - at);
    at = end + 1;
    ++line;
    if (!s.empty() && s.back() == '\r') s.remove_suffix(1);
    if (line == 1 && s.rfind("#version", 0) == 0) continue;
    const std::string where = fmt::format("{}: line {}", merges_path, line);
    const auto space = s.find(' ');
    if (space == std::string_view::npos || space == 0 || space + 1 == s.size() ||
        s.find(' ', space + 1) != std::string_view::npos)
      throw InputError(fmt::format("{}: \"{}\" is not a merge: expected two tokens separated by one space", where, s));
    m.add_merge(s.substr(0, space), s.substr(space + 1), where);
  }
  m.pre.add_stage(kGpt2Pattern, false, vocab_path);
  return t;
}

std::int64_t BpeTokenizer::vocab_size() const { return impl_->size; }

void BpeTokenizer::encode(std::string_view document, std::vector<std::int32_t>& out) const {
  encode_prefix(document, document.size(), out);
}

bool BpeTokenizer::encode_prefix(std::string_view window, std::size_t cut, std::vector<std::int32_t>& out) const {
  const Impl& m = *impl_;
  std::size_t pos = 0;
  while (pos < cut) {
    std::size_t index = 0, start = 0, stop = 0;
    const bool found = m.next_added(window, pos, index, start, stop);
    const std::size_t segment_end = found ? start : window.size();
    if (!m.encode_segment(window.substr(pos, segment_end - pos), std::min(cut, segment_end) - pos, out)) return false;
    if (!found || start >= cut) break;
    if (stop > cut) return false;
    out.push_back(m.added[index].id);
    pos = stop;
  }
  return true;
}

std::string BpeTokenizer::decode(std::span<const std::int32_t> ids) const {
  std::string text;
  for (const std::int32_t id : ids)
    if (id >= 0 && std::size_t(id) < impl_->id_known.size() && impl_->id_known[std::size_t(id)])
      text += impl_->id_bytes[std::size_t(id)];
  return text;
}

}  // namespace tessera::io
