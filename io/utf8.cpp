#include "io/utf8.hpp"

namespace tessera::io::utf8 {

namespace {

// Length of the well-formed prefix of the sequence at text[at] (0: the lead byte is not a lead
// byte), and whether it is complete.
struct Prefix {
  std::size_t length;
  bool complete;
};

Prefix well_formed_prefix(std::string_view text, std::size_t at) {
  const auto byte = [&](std::size_t i) { return static_cast<std::uint8_t>(text[i]); };
  const std::uint8_t c = byte(at);
  if (c < 0x80) return {1, true};
  std::size_t need = 0;
  std::uint8_t lo = 0x80, hi = 0xBF;  // the range of the second byte (Table 3-7)
  if (c >= 0xC2 && c <= 0xDF) need = 1;
  else if (c >= 0xE0 && c <= 0xEF) {
    need = 2;
    if (c == 0xE0) lo = 0xA0;
    if (c == 0xED) hi = 0x9F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    need = 3;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;
  } else {
    return {0, false};
  }
  std::size_t n = 1;
  for (; n <= need; ++n) {
    if (at + n >= text.size()) return {n, false};
    const std::uint8_t b = byte(at + n);
    if (n == 1 ? (b < lo || b > hi) : (b < 0x80 || b > 0xBF)) return {n, false};
  }
  return {n, true};
}

}  // namespace

std::optional<std::size_t> first_invalid(std::string_view text) {
  std::size_t i = 0;
  while (i < text.size()) {
    // ASCII runs, eight bytes at a time.
    while (i + 8 <= text.size()) {
      std::uint64_t word = 0;
      for (int k = 0; k < 8; ++k) word |= std::uint64_t(static_cast<std::uint8_t>(text[i + std::size_t(k)])) << (8 * k);
      if (word & 0x8080808080808080ull) break;
      i += 8;
    }
    if (i >= text.size()) break;
    const Prefix p = well_formed_prefix(text, i);
    if (!p.complete) return i;
    i += p.length;
  }
  return std::nullopt;
}

std::string replace_invalid(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  std::size_t i = 0;
  while (i < text.size()) {
    const Prefix p = well_formed_prefix(text, i);
    if (p.complete) {
      out.append(text.substr(i, p.length));
      i += p.length;
    } else {
      out.append("\xEF\xBF\xBD");
      i += p.length == 0 ? 1 : p.length;
    }
  }
  return out;
}

void append(std::string& out, char32_t c) {
  if (c < 0x80) {
    out.push_back(static_cast<char>(c));
  } else if (c < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (c >> 6)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else if (c < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (c >> 12)));
    out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (c >> 18)));
    out.push_back(static_cast<char>(0x80 | ((c >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  }
}

bool is_white_space(char32_t c) {
  // PropList.txt, White_Space (unchanged since Unicode 6.3).
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

}  // namespace tessera::io::utf8
