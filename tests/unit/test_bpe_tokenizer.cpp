// The byte-level BPE against Hugging Face's `tokenizers`: tests/data/bpe holds tokenizer files
// and the ids HF's encode(text, add_special_tokens=False) gave for three texts (KJV Genesis 1-3,
// a non-ASCII sample, bytes that are not UTF-8 read as Python's decode(errors="replace")),
// made by tools/make_bpe_fixtures.py. Every id must match. Also: decode(encode(x)) == x, the
// encoding of a text cut in two at the cuts `prepare text` uses on several ranks, UTF-8
// replacement and SHA-256 against known answers, and the errors on bad tokenizer files.
#include <gtest/gtest.h>

#include <fstream>
#include <functional>
#include <sstream>

#include "core/error.hpp"
#include "io/bpe_tokenizer.hpp"
#include "io/sha256.hpp"
#include "io/utf8.hpp"

namespace tessera::io {
namespace {

const std::string kDir = TESSERA_BPE_FIXTURES;

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in) << path;
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::vector<std::int32_t> ids_of(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::int32_t> ids;
  for (std::int32_t id = 0; in >> id;) ids.push_back(id);
  return ids;
}

BpeTokenizer load(const std::string& variant) {
  if (variant == "gpt2-files")
    return BpeTokenizer::from_vocab_merges(slurp(kDir + "/gpt2/vocab.json"), slurp(kDir + "/gpt2/merges.txt"),
                                           "vocab.json", "merges.txt");
  return BpeTokenizer::from_json(slurp(kDir + "/" + variant + "/tokenizer.json"), variant);
}

std::vector<std::int32_t> encode(const BpeTokenizer& t, const std::string& text) {
  std::vector<std::int32_t> ids;
  t.encode(text, ids);
  return ids;
}

const char* const kVariants[] = {"gpt2", "gpt2-files", "llama3", "qwen2"};
const char* const kTexts[] = {"kjv_slice", "nonascii", "invalid"};

TEST(Tokenizer, IdsAreHuggingFacesForEveryVariantAndText) {
  for (const std::string variant : kVariants) {
    const BpeTokenizer t = load(variant);
    for (const std::string text : kTexts) {
      const std::string raw = slurp(kDir + "/" + text + (text == "invalid" ? ".bin" : ".txt"));
      const std::string expected_file =
          kDir + "/" + variant.substr(0, variant.find('-')) + "/" + text + (variant == "gpt2-files" ? "_files" : "") + ".ids";
      const std::vector<std::int32_t> expected = ids_of(expected_file);
      ASSERT_GT(expected.size(), 10u) << expected_file;
      EXPECT_EQ(encode(t, utf8::replace_invalid(raw)), expected) << variant << " " << text;
    }
  }
}

TEST(Tokenizer, DecodeInvertsEncode) {
  // Where HF's encoding keeps the text: gpt2's <|sep|> (lstrip, rstrip) drops the spaces around
  // it, and qwen2's NFC composes the non-ASCII sample's combining marks; those two are left out.
  std::string nonascii = slurp(kDir + "/nonascii.txt");
  const std::string sep = " <|sep|> ";
  std::string no_sep = nonascii;
  no_sep.replace(no_sep.find(sep), sep.size(), "  ");
  for (const std::string variant : kVariants) {
    const BpeTokenizer t = load(variant);
    for (const std::string& s : {slurp(kDir + "/kjv_slice.txt"), variant == "gpt2" ? no_sep : nonascii}) {
      if (variant == "qwen2" && s == nonascii) continue;
      EXPECT_EQ(t.decode(encode(t, s)), s) << variant;
    }
  }
  EXPECT_NE(load("gpt2").decode(encode(load("gpt2"), nonascii)), nonascii);  // the spaces around <|sep|>
  // Every byte value, as a one-byte piece each.
  const BpeTokenizer t = load("gpt2");
  std::string bytes;
  for (int b = 0; b < 128; ++b) bytes += {static_cast<char>(b), ' '};
  EXPECT_EQ(t.decode(encode(t, bytes)), bytes);
}

TEST(Tokenizer, EncodingInTwoPartsAtLineCutsEqualsTheWhole) {
  const std::string text = slurp(kDir + "/kjv_slice.txt") + slurp(kDir + "/nonascii.txt");
  for (const std::string variant : kVariants) {
    const BpeTokenizer t = load(variant);
    const std::vector<std::int32_t> whole = encode(t, text);
    int cuts = 0;
    for (std::size_t cut = 1; cut < text.size(); cut += 97) {
      while (cut < text.size() && !(text[cut - 1] == '\n' && text[cut] >= '!' && text[cut] <= '~')) ++cut;
      if (cut >= text.size()) break;
      std::vector<std::int32_t> ids;
      ASSERT_TRUE(t.encode_prefix(text, cut, ids)) << variant << " cut " << cut;
      t.encode(std::string_view(text).substr(cut), ids);
      EXPECT_EQ(ids, whole) << variant << " cut " << cut;
      ++cuts;
    }
    EXPECT_GT(cuts, 50);
  }
  // A cut inside a pre-token is refused: "In the" cut after "I".
  std::vector<std::int32_t> ids;
  EXPECT_FALSE(load("gpt2").encode_prefix("In the beginning", 1, ids));
}

TEST(Tokenizer, Utf8ReplacementIsPythons) {
  // bytes.decode("utf-8", "replace") of each, from Python 3.11.
  EXPECT_EQ(utf8::replace_invalid("a\x80z"), "a\uFFFDz");
  EXPECT_EQ(utf8::replace_invalid("\xc0\xaf"), "\uFFFD\uFFFD");
  EXPECT_EQ(utf8::replace_invalid("\xed\xa0\x80"), "\uFFFD\uFFFD\uFFFD");
  EXPECT_EQ(utf8::replace_invalid("\xf4\x90\x80\x80"), "\uFFFD\uFFFD\uFFFD\uFFFD");
  EXPECT_EQ(utf8::replace_invalid("\xe6\x97"), "\uFFFD");
  EXPECT_EQ(utf8::replace_invalid("\xe6\x97x"), "\uFFFDx");
  EXPECT_EQ(utf8::replace_invalid("\xf0\x9f\x98\x80"), "\U0001F600");
  EXPECT_EQ(utf8::first_invalid("ok \xe6\x97\xa5 \xff"), 7u);
  EXPECT_EQ(utf8::first_invalid("\xe6\x97\xa5"), std::nullopt);
}

TEST(Tokenizer, Sha256KnownAnswers) {
  EXPECT_EQ(sha256_hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(sha256_hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(sha256_hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
}

void expect_error(const std::function<void()>& f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "no error; expected " << needle;
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(Tokenizer, BadTokenizerFilesAreInputErrors) {
  const std::string good = slurp(kDir + "/gpt2/tokenizer.json");
  const auto edited = [&](const std::string& from, const std::string& to) {
    std::string s = good;
    const auto at = s.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    return s.replace(at, from.size(), to);
  };
  const auto json = [](const std::string& text) { return [text] { BpeTokenizer::from_json(text, "t.json"); }; };
  expect_error(json(edited("\"type\": \"BPE\"", "\"type\": \"WordPiece\"")), "t.json: model type \"WordPiece\" is not supported");
  expect_error(json(edited("\"type\": \"BPE\"", "\"type\": \"Unigram\"")), "model type \"Unigram\"");
  expect_error(json(edited("\"byte_fallback\": false", "\"byte_fallback\": true")), "byte_fallback");
  expect_error(json(edited("\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"trim_offsets\": true",
                           "\"type\": \"Whitespace\", \"add_prefix_space\": false, \"trim_offsets\": true")),
               "pre-tokenizer type \"Whitespace\" is not supported");
  expect_error(json(edited("\"normalizer\": null", "\"normalizer\": {\"type\": \"NFKC\"}")), "normalizer \"NFKC\"");
  expect_error(json(edited("[\"t\", \"h\"]", "[\"t\", \"XQXQ\"]")), "t.json: model.merges[0]: \"XQXQ\" is not in the vocabulary");
  expect_error(json(edited("[\"t\", \"h\"]", "\"t h x\"")), "model.merges[0]: \"t h x\" is not two tokens");
  expect_error(json(edited("\"!\": ", "\"not-a-byte\": ")), "no token for byte 0x21");
  expect_error(json(good.substr(0, good.size() / 2)), "t.json: not valid JSON");
  const std::string vocab = slurp(kDir + "/gpt2/vocab.json");
  const auto files = [&](const std::string& merges) {
    return [&vocab, merges] { BpeTokenizer::from_vocab_merges(vocab, merges, "v.json", "m.txt"); };
  };
  expect_error(files("#version: 0.2\nt h\nth\n"), "m.txt: line 3: \"th\" is not a merge");
  expect_error(files("#version: 0.2\nt h\nt  h\n"), "m.txt: line 3");
  expect_error(files("t h\nq XQXQ\n"), "m.txt: line 2: \"XQXQ\" is not in the vocabulary");
  // A merge whose result is not in the vocabulary.
  expect_error(files("Z Z\n"), "m.txt: line 1: the merge of \"Z\" and \"Z\" makes \"ZZ\", which is not in the vocabulary");
}

}  // namespace
}  // namespace tessera::io
