#include "io/text_shards.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>

#include "core/error.hpp"
#include "io/utf8.hpp"

namespace tessera::io {

namespace {

// How far past a share's end a rank reads, so the expressions see the text that follows.
constexpr std::uint64_t kLookahead = 64 * 1024;

std::string read_range(const std::string& path, std::uint64_t offset, std::uint64_t bytes) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError(fmt::format("{}: cannot open: {}", path, std::strerror(errno)));
  std::string text(bytes, '\0');
  in.seekg(static_cast<std::streamoff>(offset));
  in.read(text.data(), static_cast<std::streamsize>(bytes));
  if (static_cast<std::uint64_t>(in.gcount()) != bytes)
    throw InputError(fmt::format("{}: read failed at byte {} (the file changed while being read?)", path, offset));
  return text;
}

bool is_cut(const std::string& text, std::size_t i) {
  return i > 0 && text[i - 1] == '\n' && text[i] >= '!' && text[i] <= '~';
}

}  // namespace

TextCursor find_cut(const std::vector<std::string>& paths, const std::vector<std::uint64_t>& sizes,
                    std::uint64_t at, bool within_files) {
  std::size_t f = 0;
  while (f < sizes.size() && at >= sizes[f]) at -= sizes[f++];
  if (f == sizes.size() || at == 0) return {f, 0};
  if (within_files) {
    // Scan forward in blocks (each overlapping the last by a byte) for "\n" then a graphic ASCII.
    constexpr std::uint64_t kBlock = 1 << 16;
    for (std::uint64_t start = at - 1; start + 1 < sizes[f]; start += kBlock) {
      const std::string block = read_range(paths[f], start, std::min(kBlock + 1, sizes[f] - start));
      for (std::size_t i = 1; i < block.size(); ++i)
        if (is_cut(block, i)) return {f, start + i};
    }
  }
  return {f + 1, 0};
}

bool encode_share(const BpeTokenizer& tokenizer, const std::vector<std::string>& paths,
                  const std::vector<std::uint64_t>& sizes, TextCursor from, TextCursor to, InvalidUtf8 invalid,
                  std::vector<std::int32_t>& out) {
  for (std::size_t f = from.file; f < paths.size() && (f < to.file || (f == to.file && to.offset > 0)); ++f) {
    const std::uint64_t begin = f == from.file ? from.offset : 0;
    const std::uint64_t end = f == to.file ? to.offset : sizes[f];
    if (begin >= end) continue;
    const std::uint64_t window_end = std::min(sizes[f], end + kLookahead);
    std::string window = read_range(paths[f], begin, window_end - begin);
    std::size_t cut = end - begin;
    const auto bad = utf8::first_invalid(std::string_view(window).substr(0, cut));
    if (bad && invalid == InvalidUtf8::error) {
      const auto byte = static_cast<std::uint8_t>(window[*bad]);
      throw InputError(fmt::format("{}: byte {} (0x{:02x}) is not UTF-8; a BPE tokenizer reads Unicode text "
                                   "(--invalid-utf8 replace reads each bad sequence as U+FFFD)",
                                   paths[f], begin + *bad, byte));
    }
    if (invalid == InvalidUtf8::replace) {
      // The cut follows a '\n', so the two sides are replaced on their own.
      std::string head = utf8::replace_invalid(std::string_view(window).substr(0, cut));
      const std::string tail = utf8::replace_invalid(std::string_view(window).substr(cut));
      cut = head.size();
      window = std::move(head) + tail;
    } else if (const auto tail_bad = utf8::first_invalid(std::string_view(window).substr(cut))) {
      window.resize(cut + *tail_bad);  // the lookahead stops before the next share's bad byte
    }
    if (!tokenizer.encode_prefix(window, cut, out)) return false;
  }
  return true;
}

}  // namespace tessera::io
