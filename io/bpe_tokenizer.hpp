#pragma once
// Byte-level BPE (GPT-2, Llama 3, Qwen2 and every tokenizer built the same way), read from a
// Hugging Face tokenizer.json or from GPT-2's vocab.json + merges.txt, encoding and decoding as
// Hugging Face's `tokenizers` does (docs/data.md "Tokenizers").
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace tessera::io {

class BpeTokenizer {
 public:
  /// \brief Reads a Hugging Face tokenizer.json: model "BPE" over byte-level symbols, a
  /// pre_tokenizer of ByteLevel, Split (behavior "Isolated") and Sequence steps with a ByteLevel
  /// among them, normalizer null or NFC, decoder ByteLevel or null, and added_tokens. InputError
  /// naming path and the field for anything else or anything inconsistent (a merge of tokens not
  /// in the vocabulary, a byte without a token, an expression PCRE2 does not compile).
  static BpeTokenizer from_json(std::string_view json, const std::string& path);
  /// \brief Reads GPT-2's two files: vocab.json (token -> id) and merges.txt (an optional
  /// "#version" line, then one merge "a b" a line, in rank order); GPT-2's pre-tokenizer, no
  /// added tokens (as Hugging Face's ByteLevelBPETokenizer.from_file). InputError naming the file
  /// and line of what does not parse.
  static BpeTokenizer from_vocab_merges(std::string_view vocab_json, std::string_view merges_txt,
                                        const std::string& vocab_path, const std::string& merges_path);
  ~BpeTokenizer();
  BpeTokenizer(BpeTokenizer&&) noexcept;
  BpeTokenizer& operator=(BpeTokenizer&&) noexcept;

  /// \brief The largest token id plus one (vocabulary and added tokens).
  std::int64_t vocab_size() const;

  /// \brief Appends the ids of document (valid UTF-8) to out: Hugging Face's
  /// encode(document, add_special_tokens=False).
  void encode(std::string_view document, std::vector<std::int32_t>& out) const;

  /// \brief Appends the ids of window[0, cut) to out, where window starts a document or at a
  /// cut that an earlier encode_prefix accepted, and goes on past cut with the document's text
  /// (the lookahead the expressions see). Returns true when no added token or pre-token crosses
  /// cut: the ids are then those the whole document's encoding has for these bytes. A cut must
  /// follow a '\n' and precede an ASCII character from '!' to '~' (there NFC cannot join the
  /// two sides); the caller chooses such cuts.
  bool encode_prefix(std::string_view window, std::size_t cut, std::vector<std::int32_t>& out) const;

  /// \brief The bytes of ids (Hugging Face's decode with the ByteLevel decoder, special tokens
  /// kept); ids without a token are skipped, as Hugging Face skips them.
  std::string decode(std::span<const std::int32_t> ids) const;

 private:
  BpeTokenizer();
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tessera::io
