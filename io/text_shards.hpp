#pragma once
// Splitting text files over ranks for `prepare text --tokenizer`: each rank encodes a share of
// the concatenated inputs, cut where the encoding of every file as one document is unchanged.
#include <cstdint>
#include <string>
#include <vector>

#include "io/bpe_tokenizer.hpp"

namespace tessera::io {

/// A position in the inputs: byte `offset` of file `file` (file == count: the end).
struct TextCursor {
  std::size_t file = 0;
  std::uint64_t offset = 0;
  bool operator==(const TextCursor&) const = default;
};

/// How invalid UTF-8 in an input is treated.
enum class InvalidUtf8 { error, replace };

/// \brief The first cut at or after byte `at` of the concatenation of the inputs (sizes in
/// bytes): the start of a file, or, when within_files, a position inside a file that follows a
/// '\n' and holds an ASCII character from '!' to '~' (BpeTokenizer::encode_prefix). Reads the
/// file from there as far as the next such position. InputError naming a file it cannot read.
TextCursor find_cut(const std::vector<std::string>& paths, const std::vector<std::uint64_t>& sizes,
                    std::uint64_t at, bool within_files);

/// \brief Appends the ids of the text in [from, to) to out, each file encoded as one document
/// (from and to cuts of find_cut). Returns false when the encoding of a file crosses `to` inside
/// it (BpeTokenizer::encode_prefix): the caller must then cut at files only. Invalid UTF-8 in
/// the share: InputError naming the file and the byte's offset (InvalidUtf8::error), or each
/// ill-formed subsequence read as U+FFFD (replace).
bool encode_share(const BpeTokenizer& tokenizer, const std::vector<std::string>& paths,
                  const std::vector<std::uint64_t>& sizes, TextCursor from, TextCursor to, InvalidUtf8 invalid,
                  std::vector<std::int32_t>& out);

}  // namespace tessera::io
