#pragma once
// UTF-8 as the tokenizers read it: validation, Python's decode(errors="replace") and the Unicode
// White_Space property.
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace tessera::io::utf8 {

/// \brief The offset of the first byte of text that does not start a well-formed UTF-8 sequence
/// (Unicode's Table 3-7: no overlongs, no surrogates, nothing above U+10FFFF), or nullopt.
std::optional<std::size_t> first_invalid(std::string_view text);

/// \brief text with every ill-formed subsequence replaced by U+FFFD, one per maximal subpart
/// (Unicode 3.9, "U+FFFD substitution of maximal subparts"), which is what Python's
/// bytes.decode("utf-8", "replace") does.
std::string replace_invalid(std::string_view text);

/// \brief Decodes the code point at text[at] (well-formed UTF-8) and its length in bytes.
inline char32_t decode(std::string_view text, std::size_t at, std::size_t& length) {
  const auto b = [&](std::size_t i) { return static_cast<std::uint8_t>(text[at + i]); };
  const std::uint8_t c = b(0);
  if (c < 0x80) return length = 1, c;
  if (c < 0xE0) return length = 2, char32_t((c & 0x1F) << 6 | (b(1) & 0x3F));
  if (c < 0xF0) return length = 3, char32_t((c & 0x0F) << 12 | (b(1) & 0x3F) << 6 | (b(2) & 0x3F));
  return length = 4, char32_t((c & 0x07) << 18 | (b(1) & 0x3F) << 12 | (b(2) & 0x3F) << 6 | (b(3) & 0x3F));
}

/// \brief Appends code point c as UTF-8.
void append(std::string& out, char32_t c);

/// \brief Unicode's White_Space property (Rust's char::is_whitespace, which Hugging Face's
/// lstrip/rstrip of added tokens use).
bool is_white_space(char32_t c);

}  // namespace tessera::io::utf8
