#pragma once
// The tokenizer of a language dataset (DESIGN.md "Token datasets record their tokenizer"): read
// from the files `prepare text --tokenizer` names, stored whole in the dataset it writes, and
// read back from there by `generate`. docs/data.md "Tokenizers" describes the layout.
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "io/bpe_tokenizer.hpp"

namespace tessera::io {

/// The files a tokenizer was read from: what a dataset records.
struct TokenizerFiles {
  /// (name under /tokenizer in the dataset, content): "tokenizer.json", or "vocab.json" and
  /// "merges.txt"
  std::vector<std::pair<std::string, std::string>> files;
  std::vector<std::string> paths;  ///< as given, in the same order
};

/// \brief Reads the tokenizer at path: a Hugging Face tokenizer.json, or GPT-2's vocab.json
/// when merges (its merges.txt) is not empty. InputError naming the file for one that is missing,
/// unreadable, larger than 1 GiB or not a tokenizer tessera reads (BpeTokenizer).
BpeTokenizer read_tokenizer(const std::string& path, const std::string& merges, TokenizerFiles& files);

/// \brief The tokenizer a language dataset records: nullopt for `tokenizer = "bytes"` (one
/// token per byte), the BpeTokenizer stored under /tokenizer for "bpe". Serial: any one process
/// may call it. InputError naming the dataset when it cannot be read or names another tokenizer.
std::optional<BpeTokenizer> dataset_tokenizer(const std::string& dataset);

}  // namespace tessera::io
