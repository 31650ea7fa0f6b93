#include "io/text_tokenizer.hpp"

#include <fmt/format.h>

#include "core/error.hpp"
#include "io/h5.hpp"
#include "io/small_file.hpp"

namespace tessera::io {

namespace {

constexpr std::size_t kMaxTokenizerBytes = std::size_t{1} << 30;

std::string read_whole(const std::string& path) {
  std::string why;
  auto text = read_small_file(path, kMaxTokenizerBytes, &why);
  if (!text) throw InputError(fmt::format("{}: cannot read the tokenizer: {}", path, why));
  return std::move(*text);
}

std::string read_bytes(hid_t file, const std::string& name) {
  h5::Dataset d(TESSERA_H5(H5Dopen2(file, name.c_str(), H5P_DEFAULT)));
  const std::vector<hsize_t> dims = h5::dims(d);
  if (dims.size() != 1) h5::fail_with(fmt::format("{} is not 1-D", name));
  std::string bytes(dims[0], '\0');
  if (!bytes.empty()) TESSERA_H5(H5Dread(d, H5T_NATIVE_UINT8, H5S_ALL, H5S_ALL, H5P_DEFAULT, bytes.data()));
  return bytes;
}

}  // namespace

BpeTokenizer read_tokenizer(const std::string& path, const std::string& merges, TokenizerFiles& files) {
  files = {};
  if (merges.empty()) {
    std::string json = read_whole(path);
    BpeTokenizer t = BpeTokenizer::from_json(json, path);
    files.files.emplace_back("tokenizer.json", std::move(json));
    files.paths.push_back(path);
    return t;
  }
  std::string vocab = read_whole(path), merge_text = read_whole(merges);
  BpeTokenizer t = BpeTokenizer::from_vocab_merges(vocab, merge_text, path, merges);
  files.files.emplace_back("vocab.json", std::move(vocab));
  files.files.emplace_back("merges.txt", std::move(merge_text));
  files.paths = {path, merges};
  return t;
}

std::optional<BpeTokenizer> dataset_tokenizer(const std::string& dataset) {
  if (const auto why = h5::describe_unreadable(dataset)) throw InputError(*why);
  const h5::InputScope scope(dataset, "its tokenizer");
  const h5::File file = h5::open_serial(dataset);
  const auto name = h5::find_attr(file, "tokenizer");
  if (!name) throw InputError(fmt::format("{}: no root attribute \"tokenizer\"", dataset));
  const std::string kind = to_string(*name);
  if (kind == "bytes") return std::nullopt;
  if (kind != "bpe")
    throw InputError(fmt::format("{}: tokenizer \"{}\" is not one tessera knows (bytes, bpe)", dataset, kind));
  const std::string where = dataset + ":/tokenizer";
  if (H5Lexists(file, "/tokenizer/tokenizer.json", H5P_DEFAULT) > 0)
    return BpeTokenizer::from_json(read_bytes(file, "/tokenizer/tokenizer.json"), where + "/tokenizer.json");
  return BpeTokenizer::from_vocab_merges(read_bytes(file, "/tokenizer/vocab.json"),
                                         read_bytes(file, "/tokenizer/merges.txt"), where + "/vocab.json",
                                         where + "/merges.txt");
}

}  // namespace tessera::io
