#include "io/token_dataset.hpp"

#include <algorithm>
#include <numeric>
#include <optional>
#include <stdexcept>

#include <fmt/format.h>

#include "comm/agree.hpp"
#include "comm/mpi_check.hpp"
#include "core/error.hpp"
#include "io/column.hpp"
#include "io/h5.hpp"

namespace tessera::io {

namespace {

// Token ids reach the model as float32 inputs: every id below 2^24 is an exact float.
constexpr std::int64_t kMaxVocabulary = std::int64_t{1} << 24;
// Tokens each rank reads per round while checking an uncached split (8 MiB at int64).
constexpr std::int64_t kCheckChunk = std::int64_t{1} << 20;

}  // namespace

struct TokenSplit::Impl {
  MPI_Comm comm = MPI_COMM_NULL;
  SplitInfo info;
  h5::File file;
  h5::PropList xfer;
  Column tokens;  // rows are tokens: row_bytes is the element size
  IntegerLoader load = nullptr;
  std::int64_t context = 0, vocab = 0;
  bool cached = false;
  // Plan of the current read (uncached): the merged token ranges to read, in increasing order
  // (coalesced), and where the window of each position starts in the buffer read.
  std::vector<std::size_t> order;
  RangeIndex read_plan{{}};
  std::vector<std::size_t> start;

  std::string where() const { return fmt::format("{}: dataset {}", info.file, tokens.name); }
  void open();
  void check_tokens();
  std::optional<Found> find_bad(const std::uint8_t* raw, std::int64_t first, std::int64_t count) const;
  void plan(std::span<const std::int64_t> indices);
};

// Local: validates the layout, the type and shape of `tokens`, and `vocab_size`.
void TokenSplit::Impl::open() {
  const std::string group = "/" + info.split, name = group + "/tokens";
  if (!h5::is_group(file, group))
    throw InputError(fmt::format("{}: no group {} (expected dataset {})", info.file, group, name));
  if (!h5::is_dataset(file, name))
    throw InputError(fmt::format("{}: no dataset {} (a language split holds its tokens there, as "
                                 "`tessera prepare text` writes)", info.file, name));
  tokens = open_column(file, name);
  h5::Datatype type(TESSERA_H5(H5Dget_type(tokens.dataset)));
  const std::optional<IntegerType> integer = integer_type(type);
  if (!integer)
    throw InputError(fmt::format("{} has type {}, expected integer token ids (uint8, uint16 or "
                                 "int32)", where(), h5::type_name(type)));
  if (tokens.dims.size() != 1)
    throw InputError(fmt::format("{} has shape {}, expected [N]: one sequence of tokens", where(),
                                 shape_text(tokens.dims)));
  tokens.mem_type = integer->mem;
  tokens.row_bytes = H5Tget_size(tokens.mem_type);
  load = integer->load;

  const std::optional<Attr> v = h5::find_attr(file, "vocab_size");
  if (!v)
    throw InputError(fmt::format("{}: no root attribute vocab_size, which dataset {} needs (the "
                                 "number of token ids; `tessera prepare text` writes 256)",
                                 info.file, name));
  const auto* value = std::get_if<std::int64_t>(&*v);
  if (value == nullptr || *value < 1 || *value > kMaxVocabulary)
    throw InputError(fmt::format("{}: root attribute vocab_size is {}, expected an integer from 1 "
                                 "to {} for dataset {} (token ids travel as exact float32 values)",
                                 info.file, to_string(*v), kMaxVocabulary, name));
  vocab = *value;
  if (tokens.rows() < context + 1)
    throw InputError(fmt::format("{} has {} tokens, expected at least {}: one window of context "
                                 "= {} tokens and the token after it", where(), tokens.rows(),
                                 context + 1, context));
}

// Local: the first of raw's count tokens (tokens [first, first + count) of the dataset) outside
// [0, vocab).
std::optional<Found> TokenSplit::Impl::find_bad(const std::uint8_t* raw, std::int64_t first,
                                                std::int64_t count) const {
  for (std::int64_t k = 0; k < count; ++k) {
    const std::int64_t t = load(raw, static_cast<std::size_t>(k));
    if (t < 0 || t >= vocab) return Found{first + k, t};
  }
  return std::nullopt;
}

// Collective: each rank checks a contiguous share of the tokens, from the cache or read from the
// file in rounds of at most kCheckChunk tokens (the same number of rounds on every rank); every
// rank throws the same InputError naming the first bad token.
void TokenSplit::Impl::check_tokens() {
  int rank = 0, size = 1;
  MPI_CHECK(MPI_Comm_rank(comm, &rank));
  MPI_CHECK(MPI_Comm_size(comm, &size));
  const std::int64_t n = tokens.rows();
  const std::int64_t first = n * rank / size, last = n * (rank + 1) / size;
  std::optional<Found> bad;
  if (cached) {
    bad = find_bad(tokens.cache.data() + static_cast<std::size_t>(first) * tokens.row_bytes, first,
                   last - first);
  } else {
    const std::int64_t largest_share = (n + size - 1) / size;
    const std::int64_t rounds = (largest_share + kCheckChunk - 1) / kCheckChunk;
    for (std::int64_t r = 0; r < rounds; ++r) {
      const std::int64_t begin = std::min(last, first + r * kCheckChunk);
      const std::int64_t count = std::min(kCheckChunk, last - begin);
      agree(comm, [&] {
        select_range(tokens, begin, count);
        read_selected(tokens, static_cast<std::size_t>(count), xfer);
      });
      if (!bad) bad = find_bad(tokens.buffer.data(), begin, count);
    }
    tokens.buffer = {};
  }
  bad = first_found(comm, bad);
  if (!bad) return;
  throw InputError(fmt::format("{} has token {} at position {}, expected 0 <= token < vocab_size "
                               "= {} (root attribute)", where(), bad->value, bad->position, vocab));
}

// Checks the indices; uncached, merges the windows' token ranges [s*context, s*context +
// context + 1) in increasing order (a window shares its last token with the next window's first)
// and records where each position's window starts in the buffer that reading them fills.
void TokenSplit::Impl::plan(std::span<const std::int64_t> indices) {
  for (std::int64_t index : indices) {
    if (index < 0 || index >= info.samples)
      throw std::out_of_range(fmt::format("{}: sample index {} outside [0, {})", where(), index,
                                          info.samples));
  }
  if (cached) return;
  order.resize(indices.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::sort(order.begin(), order.end(),
            [&](std::size_t a, std::size_t b) { return indices[a] < indices[b]; });
  std::vector<RowRange> ranges;
  for (std::size_t position : order) {
    const std::int64_t begin = indices[position] * context, end = begin + context + 1;
    if (!ranges.empty() && begin <= ranges.back().first + ranges.back().count)
      ranges.back().count = std::max(ranges.back().count, end - ranges.back().first);
    else
      ranges.push_back({begin, context + 1});
  }
  read_plan = RangeIndex(coalesce(ranges, kMaxReadRanges));
  start.resize(indices.size());
  for (std::size_t i = 0; i < indices.size(); ++i)
    start[i] = static_cast<std::size_t>(read_plan.position(indices[i] * context));
}

TokenSplit::TokenSplit(MPI_Comm comm, const std::string& path, const std::string& split,
                       std::int64_t context, bool cache, std::uint64_t cache_limit, RowBlock block)
    : impl_(std::make_unique<Impl>()) {
  if (context < 1)
    throw std::invalid_argument(fmt::format("TokenSplit: context {} must be at least 1", context));
  if (block.parts < 1 || block.part < 0 || block.part >= block.parts ||
      context % (block.head_tail ? 2 * block.parts : block.parts) != 0)
    throw std::invalid_argument(fmt::format("TokenSplit: block {} of {} of a context of {}", block.part, block.parts,
                                            context));
  Impl& s = *impl_;
  s.comm = comm;
  s.info.file = path;
  s.info.split = split;
  s.context = context;
  s.cached = cache;
  const h5::InputScope scope(path);
  s.file = open_agreed(comm, path);
  s.xfer = read_transfer();
  agree(comm, [&] { s.open(); });
  if (cache) {
    const std::uint64_t bytes = h5::declared_bytes(s.tokens.dataset);
    if (bytes > cache_limit)
      throw InputError(fmt::format("{}: caching split /{} takes {:.3g} GB on every rank, more than "
                                   "the {:.3g} GB each rank of this node may use; set data.cache = "
                                   "false (windows are then read as batches need them)", path, split,
                                   static_cast<double>(bytes) / 1e9, static_cast<double>(cache_limit) / 1e9));
    agree(comm, [&] { fill_cache(s.tokens, s.xfer); });
  }
  s.check_tokens();

  s.info.samples = (s.tokens.rows() - 1) / context;
  s.info.sample_shape = {context};
  s.info.features = context;
  s.info.block = block;
  s.info.local_features = context / block.parts;
  s.info.has_labels = true;
  s.info.classes = s.vocab;
  s.info.target_width = 0;
  s.info.label_width = context / block.parts;
}

TokenSplit::~TokenSplit() = default;
TokenSplit::TokenSplit(TokenSplit&&) noexcept = default;
TokenSplit& TokenSplit::operator=(TokenSplit&&) noexcept = default;

const SplitInfo& TokenSplit::info() const { return impl_->info; }

void TokenSplit::read(std::span<const std::int64_t> indices, float* inputs, std::int32_t* labels,
                      float* /*targets*/) {
  Impl& s = *impl_;
  const std::size_t n = indices.size();
  if (n > 0 && (inputs == nullptr || labels == nullptr))
    throw std::invalid_argument("TokenSplit::read: null output buffer");
  s.plan(indices);

  // Fetch the merged windows, in increasing order, and check them; every rank learns of any
  // rank's failure (a damaged chunk, a token out of range).
  if (!s.cached) {
    const h5::InputScope scope(s.info.file);
    agree(s.comm, [&] {
      select_ranges(s.tokens, s.read_plan.ranges());
      read_selected(s.tokens, static_cast<std::size_t>(s.read_plan.total()), s.xfer);
      if (const auto bad = s.find_bad(s.tokens.buffer.data(), 0, s.read_plan.total()))
        throw InputError(fmt::format("{} has token {} where it was read for a batch, expected 0 <= "
                                     "token < vocab_size = {} (the file changed after it was opened)",
                                     s.where(), bad->value, s.vocab));
    });
  }

  // Scatter to the caller's order: position j's input is token j of the window, its label token
  // j + 1.
  const std::uint8_t* raw = s.cached ? s.tokens.cache.data() : s.tokens.buffer.data();
  // Under a block, positions [part T/parts, (part + 1) T/parts) of each window; head and tail,
  // the chunks part and 2 parts - 1 - part of c = T/(2 parts) positions each.
  const auto context = static_cast<std::size_t>(s.context);
  const auto width = static_cast<std::size_t>(s.info.label_width);
  const RowBlock& block = s.info.block;
  const std::size_t chunk = block.head_tail ? width / 2 : width;
  const std::size_t head = chunk * static_cast<std::size_t>(block.part);
  const std::size_t tail = block.head_tail ? chunk * static_cast<std::size_t>(2 * block.parts - 1 - block.part) : 0;
  for (std::size_t i = 0; i < n; ++i) {
    const std::size_t first = s.cached ? static_cast<std::size_t>(indices[i]) * context : s.start[i];
    const auto token = [&](std::size_t j) { return s.load(raw, first + j); };  // checked above
    float* x = inputs + i * width;
    std::int32_t* y = labels + i * width;
    for (std::size_t j = 0; j < width; ++j) {
      const std::size_t at = j < chunk ? head + j : tail + (j - chunk);
      x[j] = static_cast<float>(token(at));
      y[j] = static_cast<std::int32_t>(token(at + 1));
    }
  }
}

}  // namespace tessera::io
