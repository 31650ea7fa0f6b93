#include "cli/prepare_tokens.hpp"

#include <fmt/format.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <iostream>

#include "cli/commands.hpp"
#include "comm/agree.hpp"
#include "core/error.hpp"
#include "io/sha256.hpp"
#include "io/text_shards.hpp"
#include "io/text_tokenizer.hpp"
#include "io/token_writer.hpp"

namespace tessera::cli {

namespace {

namespace fs = std::filesystem;

std::vector<std::uint64_t> input_sizes(const std::vector<std::string>& inputs, const std::string& out) {
  std::vector<std::uint64_t> sizes;
  std::error_code ec;
  for (const std::string& path : inputs) {
    const fs::file_status status = fs::status(path, ec);
    if (!fs::exists(status)) throw InputError(fmt::format("{}: no such file", path));
    if (fs::is_directory(status)) throw InputError(fmt::format("{}: is a directory, expected a text file", path));
    if (!fs::is_regular_file(status))
      throw InputError(fmt::format("{}: not a regular file; with --tokenizer the inputs are shared by the ranks, "
                                   "so each must be a file (not a pipe)", path));
    if (fs::equivalent(out, path, ec))
      throw InputError(fmt::format("prepare text --out {}: is also an input; pick another output", out));
    sizes.push_back(fs::file_size(path, ec));
    if (ec) throw InputError(fmt::format("{}: {}", path, ec.message()));
    if (sizes.back() == 0) throw InputError(fmt::format("{}: empty file, nothing to tokenize", path));
  }
  return sizes;
}

// This rank's share [from, to) of the inputs: the rank's equal part of the bytes, moved to cuts.
std::pair<io::TextCursor, io::TextCursor> share(const std::vector<std::string>& inputs,
                                                const std::vector<std::uint64_t>& sizes, bool within_files) {
  std::uint64_t total = 0;
  for (const auto s : sizes) total += s;
  const auto rank = std::uint64_t(world_rank()), ranks = std::uint64_t(world_size());
  const auto cut = [&](std::uint64_t r) {
    return r == ranks ? io::TextCursor{sizes.size(), 0} : io::find_cut(inputs, sizes, total / ranks * r + std::min(r, total % ranks), within_files);
  };
  return {rank == 0 ? io::TextCursor{} : cut(rank), cut(rank + 1)};
}

}  // namespace

int prepare_tokens(const PrepareTokensArgs& a) {
  // Options: the same on every rank.
  if (!(a.val_fraction > 0.0 && a.val_fraction < 1.0))
    throw InputError(fmt::format("prepare text --val-fraction {}: must be between 0 and 1, both excluded", a.val_fraction));
  if (a.invalid_utf8 != "error" && a.invalid_utf8 != "replace")
    throw InputError(fmt::format("prepare text --invalid-utf8 {}: expected error or replace", a.invalid_utf8));
  if (a.inputs.empty()) throw InputError("prepare text: no input files");
  const auto invalid = a.invalid_utf8 == "replace" ? io::InvalidUtf8::replace : io::InvalidUtf8::error;

  // Read the tokenizer and check the inputs on every rank, then encode this rank's share; any
  // rank's failure stops all of them before anything is written.
  io::TokenizerFiles files;
  std::optional<io::BpeTokenizer> tokenizer;
  std::vector<std::uint64_t> sizes;
  agree(MPI_COMM_WORLD, [&] {
    tokenizer.emplace(io::read_tokenizer(a.tokenizer, a.merges, files));
    sizes = input_sizes(a.inputs, a.out);
  });
  std::vector<std::int32_t> tokens;
  bool within_files = true;
  for (;;) {
    int fits = 1;
    agree(MPI_COMM_WORLD, [&] {
      tokens.clear();
      const auto [from, to] = share(a.inputs, sizes, within_files);
      fits = io::encode_share(*tokenizer, a.inputs, sizes, from, to, invalid, tokens) ? 1 : 0;
    });
    MPI_Allreduce(MPI_IN_PLACE, &fits, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (fits || !within_files) break;
    within_files = false;  // a pre-token crossed a cut inside a file: cut at files only
  }

  // Where this rank's tokens go, and the split.
  std::uint64_t count = tokens.size(), first = 0, total = 0;
  MPI_Exscan(&count, &first, 1, MPI_UINT64_T, MPI_SUM, MPI_COMM_WORLD);
  if (world_rank() == 0) first = 0;
  MPI_Allreduce(&count, &total, 1, MPI_UINT64_T, MPI_SUM, MPI_COMM_WORLD);
  if (total < 2)
    throw InputError(fmt::format("{}: {} token{} in all; a train and a val split need at least 2", a.inputs.front(),
                                 total, total == 1 ? "" : "s"));
  std::uint64_t val = static_cast<std::uint64_t>(std::llround(a.val_fraction * static_cast<double>(total)));
  val = std::clamp<std::uint64_t>(val, 1, total - 1);
  const std::uint64_t train = total - val;
  const std::int64_t vocab = tokenizer->vocab_size();
  const io::ElementType type = vocab <= 65536 ? io::ElementType::uint16 : io::ElementType::int32;

  const fs::path final_path(a.out);
  agree(MPI_COMM_WORLD, [&] {
    if (world_rank() != 0 || !final_path.has_parent_path()) return;
    std::error_code ec;
    fs::create_directories(final_path.parent_path(), ec);
    if (ec)
      throw InputError(fmt::format("{}: cannot create directory: {}", final_path.parent_path().string(), ec.message()));
  });
  const std::string tmp = a.out + ".tmp";
  {
    io::TokenWriter out(MPI_COMM_WORLD, tmp);
    const std::span<const std::int32_t> mine(tokens);
    // Train takes global tokens [0, train), val [train, total).
    const std::uint64_t in_train = first >= train ? 0 : std::min(count, train - first);
    out.write("/train/tokens", train, type, std::min(first, train), mine.first(in_train));
    out.write("/val/tokens", val, type, first + in_train - std::min(first + in_train, train), mine.subspan(in_train));
    for (const auto& [name, content] : files.files) {
      const std::vector<std::int32_t> bytes =
          world_rank() == 0 ? std::vector<std::int32_t>(content.begin(), content.end()) : std::vector<std::int32_t>();
      std::vector<std::int32_t> unsigned_bytes(bytes.size());
      std::transform(bytes.begin(), bytes.end(), unsigned_bytes.begin(), [](std::int32_t b) { return b & 0xFF; });
      out.write("/tokenizer/" + name, content.size(), io::ElementType::uint8, 0, unsigned_bytes);
    }
    out.write_attr("/train", "start", std::int64_t{0});
    out.write_attr("/val", "start", static_cast<std::int64_t>(train));
    out.write_attr("/", "format", std::string("tessera-dataset"));
    out.write_attr("/", "vocab_size", vocab);
    out.write_attr("/", "tokenizer", std::string("bpe"));
    for (std::size_t i = 0; i < files.files.size(); ++i) {
      const std::string key = files.files[i].first == "merges.txt" ? "tokenizer_merges" : "tokenizer_source";
      out.write_attr("/", key, files.paths[i]);
      out.write_attr("/", key + "_sha256", io::sha256_hex(files.files[i].second));
    }
    out.write_attr("/", "invalid_utf8", a.invalid_utf8);
    out.write_attr("/", "val_fraction", a.val_fraction);
    out.write_attr("/", "source_count", static_cast<std::int64_t>(a.inputs.size()));
    for (std::size_t i = 0; i < a.inputs.size(); ++i) {
      out.write_attr("/", fmt::format("source_{}_path", i), a.inputs[i]);
      out.write_attr("/", fmt::format("source_{}_bytes", i), static_cast<std::int64_t>(sizes[i]));
    }
    out.close();
  }
  agree(MPI_COMM_WORLD, [&] {
    if (world_rank() == 0) fs::rename(tmp, final_path);
  });
  if (world_rank() == 0)
    std::cout << fmt::format("wrote {}: {} train and {} val tokens ({} ids, {}) from {} file{} on {} rank{}\n", a.out,
                             train, val, vocab, type == io::ElementType::uint16 ? "uint16" : "int32", a.inputs.size(),
                             a.inputs.size() == 1 ? "" : "s", world_size(), world_size() == 1 ? "" : "s");
  return 0;
}

}  // namespace tessera::cli
