#include "io/prepare_text.hpp"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <span>

#include <fmt/format.h>

#include "core/error.hpp"
#include "io/dataset_writer.hpp"

namespace tessera::io {

namespace {

namespace fs = std::filesystem;

constexpr std::int64_t kByteVocabulary = 256;

// Appends the bytes of the file at path to text; returns how many. Pipes (/dev/stdin, a shell's
// <(command)) read as well as regular files.
std::uint64_t append_file(const std::string& path, std::vector<std::uint8_t>& text) {
  std::error_code ec;
  const fs::file_status status = fs::status(path, ec);
  if (!fs::exists(status)) throw InputError(fmt::format("{}: no such file", path));
  if (fs::is_directory(status)) throw InputError(fmt::format("{}: is a directory, expected a text file", path));
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError(fmt::format("{}: cannot open: {}", path, std::strerror(errno)));
  const std::size_t before = text.size();
  constexpr std::size_t kChunk = std::size_t{1} << 20;
  while (in) {
    const std::size_t at = text.size();
    text.resize(at + kChunk);
    in.read(reinterpret_cast<char*>(text.data() + at), static_cast<std::streamsize>(kChunk));
    text.resize(at + static_cast<std::size_t>(in.gcount()));
  }
  if (in.bad()) throw InputError(fmt::format("{}: read failed", path));
  const std::uint64_t bytes = text.size() - before;
  if (bytes == 0) throw InputError(fmt::format("{}: empty file, nothing to tokenize", path));
  return bytes;
}

void check_not_an_input(const std::string& out_path, const std::vector<std::string>& inputs) {
  std::error_code ec;
  for (const std::string& input : inputs) {
    if (fs::equivalent(out_path, input, ec)) {
      throw InputError(fmt::format("prepare text --out {}: is also an input; pick another output", out_path));
    }
  }
}

void create_parent_directory(const fs::path& path) {
  if (!path.has_parent_path()) return;
  std::error_code ec;
  fs::create_directories(path.parent_path(), ec);
  if (ec) {
    throw InputError(fmt::format("{}: cannot create directory: {}", path.parent_path().string(), ec.message()));
  }
}

void write_dataset(const std::string& path, std::span<const std::uint8_t> text, const TextSplits& splits,
                   const std::vector<std::string>& inputs, const std::vector<std::uint64_t>& sizes,
                   double val_fraction) {
  DatasetWriter out(path);
  out.write("/train/tokens", {splits.train}, text.first(splits.train));
  out.write("/val/tokens", {splits.val}, text.subspan(splits.train));
  out.write_attr("/train", "start", std::int64_t{0});
  out.write_attr("/val", "start", static_cast<std::int64_t>(splits.train));
  out.write_attr("/", "format", std::string("tessera-dataset"));
  out.write_attr("/", "vocab_size", kByteVocabulary);
  out.write_attr("/", "tokenizer", std::string("bytes"));
  out.write_attr("/", "val_fraction", val_fraction);
  out.write_attr("/", "source_count", static_cast<std::int64_t>(inputs.size()));
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    out.write_attr("/", fmt::format("source_{}_path", i), inputs[i]);
    out.write_attr("/", fmt::format("source_{}_bytes", i), static_cast<std::int64_t>(sizes[i]));
  }
  out.close();
}

}  // namespace

TextSplits prepare_text(const std::vector<std::string>& inputs, const std::string& out_path,
                        double val_fraction) {
  // Check everything and read every input before writing anything.
  if (!(val_fraction > 0.0 && val_fraction < 1.0)) {
    throw InputError(fmt::format("prepare text --val-fraction {}: must be between 0 and 1, both excluded",
                                 val_fraction));
  }
  if (inputs.empty()) throw InputError("prepare text: no input files");
  check_not_an_input(out_path, inputs);
  std::vector<std::uint8_t> text;
  std::vector<std::uint64_t> sizes;
  for (const std::string& input : inputs) sizes.push_back(append_file(input, text));
  const std::uint64_t total = text.size();
  if (total < 2) {
    throw InputError(fmt::format("{}: 1 byte of text; a train and a val split need at least 2", inputs.front()));
  }
  TextSplits splits;
  splits.val = static_cast<std::uint64_t>(std::llround(val_fraction * static_cast<double>(total)));
  splits.val = std::clamp<std::uint64_t>(splits.val, 1, total - 1);
  splits.train = total - splits.val;

  // Write a temporary file, then rename it into place; remove it on any failure.
  const fs::path final_path(out_path);
  create_parent_directory(final_path);
  const std::string tmp_path = out_path + ".tmp";
  try {
    write_dataset(tmp_path, text, splits, inputs, sizes, val_fraction);
    fs::rename(tmp_path, final_path);
  } catch (const std::exception& e) {
    std::error_code ec;
    fs::remove(tmp_path, ec);
    throw InputError(fmt::format("{}: cannot write the dataset: {}", out_path, e.what()));
  }
  return splits;
}

}  // namespace tessera::io
