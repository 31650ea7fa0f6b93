#include "io/pre_tokenizer.hpp"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <fmt/format.h>

#include "core/error.hpp"

namespace tessera::io {

namespace {

// Hugging Face matches with Oniguruma, PCRE2 here. Where the two read an escape differently, the
// pattern is rewritten to Oniguruma's meaning: `\h` is a hexadecimal digit there, horizontal space
// in PCRE2. (`\s`, `\p{L}`, `\p{N}` agree; with PCRE2_UCP `\s` has U+0085 and U+2028 as
// Oniguruma's White_Space does, which tests/data/bpe/nonascii.txt checks.)
std::string to_pcre2(const std::string& pattern) {
  std::string out;
  bool in_class = false;
  for (std::size_t i = 0; i < pattern.size(); ++i) {
    const char c = pattern[i];
    if (c == '\\' && i + 1 < pattern.size()) {
      const char e = pattern[++i];
      if (e == 'h') out += in_class ? "0-9a-fA-F" : "[0-9a-fA-F]";
      else out += {'\\', e};
      continue;
    }
    if (c == '[' && !in_class) {
      in_class = true;
      out += c;
      // A ']' right after '[' or '[^' is a literal.
      if (i + 1 < pattern.size() && pattern[i + 1] == '^') out += pattern[++i];
      if (i + 1 < pattern.size() && pattern[i + 1] == ']') out += pattern[++i];
      continue;
    }
    if (c == ']' && in_class) in_class = false;
    out += c;
  }
  return out;
}

}  // namespace

struct PreTokenizer::Stage {
  pcre2_code* code = nullptr;  // null: no cutting
  pcre2_match_data* match = nullptr;
  bool prefix_space = false;
  ~Stage() {
    if (match) pcre2_match_data_free(match);
    if (code) pcre2_code_free(code);
  }
};

PreTokenizer::PreTokenizer() = default;
PreTokenizer::~PreTokenizer() = default;
PreTokenizer::PreTokenizer(PreTokenizer&&) noexcept = default;
PreTokenizer& PreTokenizer::operator=(PreTokenizer&&) noexcept = default;

void PreTokenizer::add_stage(const std::string& pattern, bool prefix_space, const std::string& where) {
  auto stage = std::make_unique<Stage>();
  stage->prefix_space = prefix_space;
  if (!pattern.empty()) {
    const std::string translated = to_pcre2(pattern);
    int error = 0;
    PCRE2_SIZE offset = 0;
    stage->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(translated.data()), translated.size(),
                                PCRE2_UTF | PCRE2_UCP, &error, &offset, nullptr);
    if (!stage->code) {
      PCRE2_UCHAR message[256];
      pcre2_get_error_message(error, message, sizeof message);
      throw InputError(fmt::format("{}: the expression \"{}\" does not compile (PCRE2, at offset {}: {})", where,
                                   pattern, offset, reinterpret_cast<const char*>(message)));
    }
    pcre2_jit_compile(stage->code, PCRE2_JIT_COMPLETE);  // where JIT is missing, the interpreter
    stage->match = pcre2_match_data_create_from_pattern(stage->code, nullptr);
  }
  stages_.push_back(std::move(stage));
}

bool PreTokenizer::prefixes_spaces() const {
  for (const auto& s : stages_)
    if (s->prefix_space) return true;
  return false;
}

void PreTokenizer::split(std::string_view text, std::vector<Piece>& out) const {
  scratch_.clear();
  if (!text.empty()) scratch_.push_back({0, text.size(), false});
  for (const auto& stage : stages_) {
    next_.clear();
    for (Piece p : scratch_) {
      if (stage->prefix_space && !p.space && text[p.begin] != ' ') p.space = true;
      if (!stage->code) {
        next_.push_back(p);
        continue;
      }
      // The subject: the piece itself, or a copy with its space in front.
      std::string_view subject = text.substr(p.begin, p.end - p.begin);
      std::size_t shift = 0;  // subject offset s is text offset p.begin + s - shift
      if (p.space) {
        spaced_.assign(1, ' ');
        spaced_.append(subject);
        subject = spaced_;
        shift = 1;
      }
      const auto emit = [&](std::size_t a, std::size_t b) {
        if (a == b) return;
        if (a == 0 && shift == 1) next_.push_back({p.begin, p.begin + b - 1, true});
        else next_.push_back({p.begin + a - shift, p.begin + b - shift, false});
      };
      const auto* s = reinterpret_cast<PCRE2_SPTR>(subject.data());
      std::size_t gap = 0, from = 0;
      while (from < subject.size()) {
        const int rc = pcre2_match(stage->code, s, subject.size(), from, PCRE2_NO_UTF_CHECK, stage->match, nullptr);
        if (rc < 0) break;  // no match (or a resource limit: the rest stays one piece)
        const PCRE2_SIZE* v = pcre2_get_ovector_pointer(stage->match);
        if (v[1] == v[0]) {  // an empty match cuts nothing; go on after its character
          from = v[0] + 1;
          while (from < subject.size() && (static_cast<unsigned char>(subject[from]) & 0xC0) == 0x80) ++from;
          continue;
        }
        emit(gap, v[0]);
        emit(v[0], v[1]);
        gap = from = v[1];
      }
      emit(gap, subject.size());
    }
    scratch_.swap(next_);
  }
  out.insert(out.end(), scratch_.begin(), scratch_.end());
}

}  // namespace tessera::io
