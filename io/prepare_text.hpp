#pragma once
// `tessera prepare text`: text files as byte-level tokens in the language layout of DESIGN.md.
#include <cstdint>
#include <string>
#include <vector>

namespace tessera::io {

/// The share of the text held out as the validation split when none is given.
inline constexpr double kDefaultValFraction = 0.1;

/// Tokens in each split of a prepared text dataset.
struct TextSplits {
  std::uint64_t train = 0, val = 0;
};

/// \brief Concatenates the files `inputs`, in the order given, and writes their bytes as tokens
/// (vocabulary 256, one token per byte, token = byte value) to out_path:
///  - `/train/tokens` uint8 [T - V]: the first T - V bytes of the concatenation (T in all);
///  - `/val/tokens` uint8 [V]: the last V = round(val_fraction * T) bytes, at least 1 and at most
///    T - 1, so the validation text is contiguous and never seen in training;
///  - root attributes `vocab_size` = 256, `tokenizer` = "bytes", `format` = "tessera-dataset",
///    `val_fraction`, `source_count` and per input i `source_<i>_path` (as given) and
///    `source_<i>_bytes`; each split group has `start`, the index of its first token in the
///    concatenation.
/// Reads every input before writing; writes out_path + ".tmp", then renames it (creating the
/// parent directory); on any error no file is left behind. Serial: call it on one rank.
/// InputError naming the file or option when an input is missing, unreadable or empty, the text
/// has fewer than 2 bytes, val_fraction is not in (0, 1), out_path is one of the inputs, or the
/// output cannot be written.
TextSplits prepare_text(const std::vector<std::string>& inputs, const std::string& out_path,
                        double val_fraction);

}  // namespace tessera::io
