#pragma once
// The pre-tokenizer of a byte-level BPE: the regular expressions that cut text into the pieces
// BPE merges within (Hugging Face's `Split` with behavior "Isolated", and `ByteLevel` with
// use_regex, which is GPT-2's expression), matched by PCRE2 with Unicode properties.
#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace tessera::io {

/// GPT-2's pre-tokenizer expression, which Hugging Face's ByteLevel pre-tokenizer applies when
/// use_regex is true.
inline constexpr const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

/// \brief A sequence of stages, each cutting every piece of the previous one: a stage may first
/// prepend a space to a piece that does not start with one (ByteLevel's add_prefix_space), then
/// cuts it at the matches of its expression (each match a piece, and each gap between matches).
class PreTokenizer {
 public:
  /// A piece: text[begin, end), preceded by a space that is not in text when `space`.
  struct Piece {
    std::size_t begin = 0, end = 0;
    bool space = false;
  };

  PreTokenizer();
  ~PreTokenizer();
  PreTokenizer(PreTokenizer&&) noexcept;
  PreTokenizer& operator=(PreTokenizer&&) noexcept;

  /// \brief Appends a stage. pattern is in the syntax of Hugging Face's regex engine
  /// (Oniguruma): `\s` is Unicode's White_Space, also inside classes; empty: no cutting.
  /// InputError "<where>: ..." when PCRE2 does not compile it.
  void add_stage(const std::string& pattern, bool prefix_space, const std::string& where);
  /// \brief Whether any stage prepends spaces (pieces then may have `space` set).
  bool prefixes_spaces() const;
  /// \brief Cuts text (valid UTF-8) into pieces, appended to out in order; empty pieces are
  /// dropped. Not thread-safe (one match buffer per object).
  void split(std::string_view text, std::vector<Piece>& out) const;

 private:
  struct Stage;
  std::vector<std::unique_ptr<Stage>> stages_;
  mutable std::vector<Piece> scratch_, next_;
  mutable std::string spaced_;
};

}  // namespace tessera::io
