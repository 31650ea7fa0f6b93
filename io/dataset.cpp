#include "io/dataset.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <optional>
#include <stdexcept>

#include <fmt/format.h>

#include "core/error.hpp"
#include "comm/agree.hpp"
#include "io/column.hpp"
#include "io/h5.hpp"
#include "io/token_dataset.hpp"
#include "comm/mpi_check.hpp"

namespace tessera::io {

namespace {

// Classes of a supervised split: the model's outputs and the labels' range. Labels reach the loss
// as int32, and 2^24 keeps every class index an exact float32 too.
constexpr std::int64_t kMaxClasses = std::int64_t{1} << 24;
// Labels each rank reads per round while scanning a split at open.
constexpr std::int64_t kScanRows = std::int64_t{1} << 20;

float numeric_attr(hid_t obj, const std::string& where, const char* name, float fallback) {
  std::optional<Attr> value = h5::find_attr(obj, name);
  if (!value) return fallback;
  double number = 0.0;
  if (const auto* d = std::get_if<double>(&*value)) number = *d;
  else if (const auto* i = std::get_if<std::int64_t>(&*value)) number = static_cast<double>(*i);
  else throw InputError(fmt::format("{}: attribute {} is a string, expected a number", where, name));
  if (!std::isfinite(number) || std::abs(number) > std::numeric_limits<float>::max())
    throw InputError(fmt::format("{}: attribute {} is {}, expected a finite float32 number", where,
                                 name, to_string(*value)));
  return static_cast<float>(number);
}

}  // namespace

struct SupervisedSplit::Impl {
  MPI_Comm comm = MPI_COMM_NULL;
  SplitInfo info;
  h5::File file;
  h5::PropList xfer;
  Column inputs, answers;  // answers: labels or targets
  IntegerLoader load_label = nullptr;
  bool cached = false;
  // Plan of the current read: positions sorted by index, the unique rows, the ranges read (the
  // rows' runs, coalesced) and the buffer row of each position.
  std::vector<std::size_t> order, slot;
  std::vector<std::int64_t> rows;
  RangeIndex read_plan{{}};

  std::string where(const std::string& dataset) const {
    return fmt::format("{}: dataset {}", info.file, dataset);
  }
  void open_inputs();
  void open_answers();
  void apply_block(Column& c);
  void scan_labels();
  void fill_caches(std::uint64_t cache_limit);
  void check_rows(const Column& c, std::span<const std::int64_t> which, const std::uint8_t* raw) const;
  void plan(std::span<const std::int64_t> indices);
  const std::uint8_t* row(const Column& c, std::size_t position, std::int64_t index) const {
    return cached ? c.cache.data() + static_cast<std::size_t>(index) * c.row_bytes
                  : c.buffer.data() + slot[position] * c.row_bytes;
  }
};

void SupervisedSplit::Impl::open_inputs() {
  const std::string group = "/" + info.split;
  if (!h5::is_group(file, group)) {
    throw InputError(fmt::format(
        "{}: no group {} (expected datasets {}/inputs and {}/labels or {}/targets)", info.file,
        group, group, group, group));
  }
  const std::string name = group + "/inputs";
  if (!h5::is_dataset(file, name)) throw InputError(fmt::format("{}: no dataset {}", info.file, name));
  inputs = open_column(file, name);
  h5::Datatype type(TESSERA_H5(H5Dget_type(inputs.dataset)));
  if (!is_uint8(type) && !is_float32(type)) {
    throw InputError(fmt::format("{} has type {}, expected uint8 or float32", where(name),
                                 h5::type_name(type)));
  }
  if (inputs.dims.size() < 2) {
    throw InputError(fmt::format("{} has shape {}, expected [N, ...] of rank >= 2", where(name),
                                 shape_text(inputs.dims)));
  }
  inputs.mem_type = is_uint8(type) ? H5T_NATIVE_UINT8 : H5T_NATIVE_FLOAT;
  inputs.row_bytes = row_elements(inputs.dims) * H5Tget_size(inputs.mem_type);
  info.samples = inputs.rows();
  info.sample_shape.assign(inputs.dims.begin() + 1, inputs.dims.end());
  info.features = static_cast<std::int64_t>(row_elements(inputs.dims));
  if (info.samples == 0) throw InputError(fmt::format("{} has no rows", where(name)));
  if (info.features == 0) {
    throw InputError(fmt::format("{} has shape {}, with no values per sample", where(name),
                                 shape_text(inputs.dims)));
  }
  info.scale = numeric_attr(inputs.dataset, where(name), "scale", 1.0f);
  info.offset = numeric_attr(inputs.dataset, where(name), "offset", 0.0f);
  if (is_uint8(type) && !std::isfinite(255.0f * info.scale + info.offset))
    throw InputError(fmt::format("{}: attributes scale = {} and offset = {} map stored bytes beyond "
                                 "float32 (255 x scale + offset is not finite)", where(name),
                                 info.scale, info.offset));
}

// Makes reads of c take this rank's block of rows of each sample (info.block).
void SupervisedSplit::Impl::apply_block(Column& c) {
  const RowBlock b = info.block;
  if (b.parts <= 1) return;
  const auto axis = c.dims.size() - 2;
  if (c.dims.size() < 3 || c.dims[axis] % static_cast<hsize_t>(b.parts) != 0)
    throw InputError(fmt::format(
        "{} has shape {}: parallel.spatial = {} splits each sample's grid into blocks of rows (axis H of "
        "[N, C, H, W]), {}", where(c.name), shape_text(c.dims), b.parts,
        c.dims.size() < 3 ? "but its samples have no rows and columns"
                          : fmt::format("but {} does not divide H = {}", b.parts, c.dims[axis])));
  const hsize_t height = c.dims[axis] / static_cast<hsize_t>(b.parts);
  const std::size_t elems = set_block(c, static_cast<int>(axis), height * static_cast<hsize_t>(b.part), height);
  c.row_bytes = elems * H5Tget_size(c.mem_type);
}

void SupervisedSplit::Impl::open_answers() {
  const std::string labels_name = "/" + info.split + "/labels";
  const std::string targets_name = "/" + info.split + "/targets";
  const bool has_labels = h5::is_dataset(file, labels_name);
  const bool has_targets = h5::is_dataset(file, targets_name);
  if (has_labels == has_targets) {
    throw InputError(fmt::format("{}: {} datasets {} and {}, expected exactly one of them",
                                 info.file, has_labels ? "both" : "neither of the", labels_name,
                                 targets_name));
  }
  const std::string& name = has_labels ? labels_name : targets_name;
  answers = open_column(file, name);
  h5::Datatype type(TESSERA_H5(H5Dget_type(answers.dataset)));
  info.has_labels = has_labels;
  if (has_labels) {
    std::optional<IntegerType> integer = integer_type(type);
    if (!integer) {
      throw InputError(fmt::format("{} has type {}, expected an integer type", where(name),
                                   h5::type_name(type)));
    }
    if (answers.dims.size() != 1) {
      throw InputError(fmt::format("{} has shape {}, expected [N]", where(name),
                                   shape_text(answers.dims)));
    }
    answers.mem_type = integer->mem;
    load_label = integer->load;
    if (std::optional<Attr> classes = h5::find_attr(answers.dataset, "classes")) {
      const auto* value = std::get_if<std::int64_t>(&*classes);
      if (value == nullptr || *value <= 0 || *value > kMaxClasses) {
        throw InputError(fmt::format("{}: attribute classes is {}, expected an integer from 1 to {}",
                                     where(name), to_string(*classes), kMaxClasses));
      }
      info.classes = *value;
    }
  } else {
    if (!is_float32(type) || answers.dims.empty()) {
      throw InputError(fmt::format("{} has type {} and shape {}, expected float32 [N, ...]",
                                   where(name), h5::type_name(type), shape_text(answers.dims)));
    }
    answers.mem_type = H5T_NATIVE_FLOAT;
    info.target_width = static_cast<std::int64_t>(row_elements(answers.dims));
    info.target_shape.assign(answers.dims.begin() + 1, answers.dims.end());
  }
  answers.row_bytes = row_elements(answers.dims) * H5Tget_size(answers.mem_type);
  if (has_labels && info.block.parts > 1)
    throw InputError(fmt::format("{} holds class labels, but parallel.spatial = {} splits each sample's grid: "
                                 "a block of a sample has no class of its own (spatial parallelism needs "
                                 "targets, fields of [N, C, H, W])", where(name), info.block.parts));
  apply_block(inputs);
  apply_block(answers);
  info.local_features = static_cast<std::int64_t>(inputs.row_elems());
  info.local_target_width = has_labels ? 0 : static_cast<std::int64_t>(answers.row_elems());
  if (answers.rows() != inputs.rows()) {
    throw InputError(fmt::format("{} has {} rows but {} has {}", where(name), answers.rows(),
                                 inputs.name, inputs.rows()));
  }
}

// Collective: each rank reads a slice of the labels in rounds of at most kScanRows (the same
// number of rounds on every rank); every rank learns classes (if no attribute gave it) and
// throws the same InputError if any label is outside [0, classes) or classes exceeds kMaxClasses.
void SupervisedSplit::Impl::scan_labels() {
  int rank = 0, size = 1;
  MPI_CHECK(MPI_Comm_rank(comm, &rank));
  MPI_CHECK(MPI_Comm_size(comm, &size));
  const std::int64_t n = info.samples;
  const std::int64_t first = n * rank / size, last = n * (rank + 1) / size;
  const std::int64_t rounds = ((n + size - 1) / size + kScanRows - 1) / kScanRows;
  const bool from_attr = info.classes > 0;
  std::int64_t local_max = std::numeric_limits<std::int64_t>::min();
  std::optional<Found> bad;
  for (std::int64_t r = 0; r < rounds; ++r) {
    const std::int64_t begin = std::min(last, first + r * kScanRows);
    const std::int64_t count = std::min(kScanRows, last - begin);
    agree(comm, [&] {
      select_range(answers, begin, count);
      read_selected(answers, static_cast<std::size_t>(count), xfer);
    });
    for (std::int64_t k = 0; k < count; ++k) {
      const std::int64_t label = load_label(answers.buffer.data(), static_cast<std::size_t>(k));
      local_max = std::max(local_max, label);
      if (!bad && (label < 0 || (from_attr && label >= info.classes))) bad = Found{begin + k, label};
    }
  }
  answers.buffer = {};
  if (!from_attr) {
    MPI_CHECK(MPI_Allreduce(&local_max, &info.classes, 1, MPI_INT64_T, MPI_MAX, comm));
    if (info.classes >= kMaxClasses)
      throw InputError(fmt::format("{}: the largest label is {}, so the model would need {} outputs; "
                                   "at most {} classes are allowed (labels 0 to {})",
                                   where(answers.name), info.classes, info.classes + 1., kMaxClasses,
                                   kMaxClasses - 1));
    info.classes = std::max<std::int64_t>(info.classes + 1, 1);
  }
  bad = first_found(comm, bad);
  if (!bad) return;
  throw InputError(fmt::format("{}: sample {} has label {}, expected 0 <= label < {}{}",
                               where(answers.name), bad->position, bad->value, info.classes,
                               from_attr ? " (attribute classes)" : ""));
}

// Collective: reads every row of inputs and answers into this rank's memory, once it is clear
// they fit in cache_limit bytes, and checks them.
void SupervisedSplit::Impl::fill_caches(std::uint64_t cache_limit) {
  // Every row's block (the whole row where there is no block).
  const std::uint64_t bytes = static_cast<std::uint64_t>(info.samples) * (inputs.row_bytes + answers.row_bytes);
  if (bytes > cache_limit)
    throw InputError(fmt::format("{}: caching split /{} takes {:.3g} GB on every rank, more than the "
                                 "{:.3g} GB each rank of this node may use; set data.cache = false "
                                 "(rows are then read as batches need them)", info.file, info.split,
                                 static_cast<double>(bytes) / 1e9, static_cast<double>(cache_limit) / 1e9));
  agree(comm, [&] {
    fill_cache(inputs, xfer);
    fill_cache(answers, xfer);
  });
  // Each rank checks a share of the rows.
  int rank = 0, size = 1;
  MPI_CHECK(MPI_Comm_rank(comm, &rank));
  MPI_CHECK(MPI_Comm_size(comm, &size));
  const std::int64_t first = info.samples * rank / size, last = info.samples * (rank + 1) / size;
  std::vector<std::int64_t> share(static_cast<std::size_t>(last - first));
  std::iota(share.begin(), share.end(), first);
  agree(comm, [&] {
    for (const Column* c : {&inputs, &answers})
      check_rows(*c, share, c->cache.data() + static_cast<std::size_t>(first) * c->row_bytes);
  });
}

// Local: throws InputError at the first bad value among `rows` of a column, held one after
// another at raw: a label outside [0, classes), or a float (inputs: after x*scale + offset) that
// is not finite.
void SupervisedSplit::Impl::check_rows(const Column& c, std::span<const std::int64_t> which,
                                       const std::uint8_t* raw) const {
  if (&c == &answers && info.has_labels) {
    for (std::size_t i = 0; i < which.size(); ++i) {
      const std::int64_t label = load_label(raw, i);
      if (label < 0 || label >= info.classes)
        throw InputError(fmt::format("{}: sample {} has label {}, expected 0 <= label < {} (the "
                                     "file changed after it was opened)", where(c.name), which[i],
                                     label, info.classes));
    }
    return;
  }
  if (c.mem_type != H5T_NATIVE_FLOAT) return;
  const bool mapped = &c == &inputs;
  const std::size_t elems = c.row_elems();
  for (std::size_t i = 0; i < which.size(); ++i)
    for (std::size_t k = 0; k < elems; ++k) {
      float v;
      std::memcpy(&v, raw + i * c.row_bytes + k * sizeof(float), sizeof v);
      if (std::isfinite(mapped ? v * info.scale + info.offset : v)) continue;
      throw InputError(fmt::format("{}: sample {} holds {} at element {}{}, expected finite values",
                                   where(c.name), which[i], v, k,
                                   mapped && std::isfinite(v) ? " (not finite after x*scale + offset)" : ""));
    }
}

void SupervisedSplit::Impl::plan(std::span<const std::int64_t> indices) {
  for (std::int64_t index : indices) {
    if (index < 0 || index >= info.samples) {
      throw std::out_of_range(fmt::format("{}: sample index {} outside [0, {})", where(inputs.name),
                                          index, info.samples));
    }
  }
  if (cached) return;
  order.resize(indices.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::sort(order.begin(), order.end(),
            [&](std::size_t a, std::size_t b) { return indices[a] < indices[b]; });
  rows.clear();
  std::vector<RowRange> runs;
  for (std::size_t position : order) {
    const std::int64_t row = indices[position];
    if (!rows.empty() && rows.back() == row) continue;
    rows.push_back(row);
    if (!runs.empty() && runs.back().first + runs.back().count == row) ++runs.back().count;
    else runs.push_back({row, 1});
  }
  read_plan = RangeIndex(coalesce(runs, kMaxReadRanges));
  slot.resize(indices.size());
  for (std::size_t i = 0; i < indices.size(); ++i)
    slot[i] = static_cast<std::size_t>(read_plan.position(indices[i]));
}

SupervisedSplit::SupervisedSplit(MPI_Comm comm, const std::string& path, const std::string& split,
                                 bool cache, std::uint64_t cache_limit, RowBlock block)
    : impl_(std::make_unique<Impl>()) {
  Impl& s = *impl_;
  s.comm = comm;
  s.info.file = path;
  s.info.split = split;
  s.info.block = block;
  s.cached = cache;
  const h5::InputScope scope(path);
  s.file = open_agreed(comm, path);
  s.xfer = read_transfer();
  agree(comm, [&] {
    s.open_inputs();
    s.open_answers();
  });
  if (s.info.has_labels) s.scan_labels();
  if (cache) s.fill_caches(cache_limit);
}

SupervisedSplit::~SupervisedSplit() = default;
SupervisedSplit::SupervisedSplit(SupervisedSplit&&) noexcept = default;
SupervisedSplit& SupervisedSplit::operator=(SupervisedSplit&&) noexcept = default;

const SplitInfo& SupervisedSplit::info() const { return impl_->info; }

void SupervisedSplit::read(std::span<const std::int64_t> indices, float* inputs,
                           std::int32_t* labels, float* targets) {
  Impl& s = *impl_;
  const std::size_t n = indices.size();
  if (n > 0 && (inputs == nullptr || (s.info.has_labels ? labels == nullptr : targets == nullptr))) {
    throw std::invalid_argument("SupervisedSplit::read: null output buffer");
  }
  s.plan(indices);

  // Fetch the unique rows, in increasing order, and check them; every rank learns of any rank's
  // failure (a damaged chunk, a non-finite value).
  if (!s.cached) {
    agree(s.comm, [&] {
      for (Column* c : {&s.inputs, &s.answers}) {
        const h5::InputScope scope(s.info.file, "dataset " + c->name);
        select_ranges(*c, s.read_plan.ranges());
        read_selected(*c, static_cast<std::size_t>(s.read_plan.total()), s.xfer);
        for (const std::int64_t row : s.rows)
          s.check_rows(*c, {&row, 1}, c->buffer.data() + static_cast<std::size_t>(s.read_plan.position(row)) * c->row_bytes);
      }
    });
  }

  // Scatter to the caller's order, mapping inputs to x*scale + offset.
  const auto features = static_cast<std::size_t>(s.info.local_features);
  const bool u8 = s.inputs.mem_type == H5T_NATIVE_UINT8;
  const float scale = s.info.scale, offset = s.info.offset;
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint8_t* src = s.row(s.inputs, i, indices[i]);
    float* dst = inputs + i * features;
    if (u8) {
      for (std::size_t j = 0; j < features; ++j) dst[j] = static_cast<float>(src[j]) * scale + offset;
    } else {
      std::memcpy(dst, src, features * sizeof(float));
      for (std::size_t j = 0; j < features; ++j) dst[j] = dst[j] * scale + offset;
    }
    const std::uint8_t* answer = s.row(s.answers, i, indices[i]);
    if (s.info.has_labels) {
      labels[i] = static_cast<std::int32_t>(s.load_label(answer, 0));  // checked: check_rows
    } else {
      std::memcpy(targets + i * static_cast<std::size_t>(s.info.local_target_width), answer,
                  s.answers.row_bytes);
    }
  }
}

std::unique_ptr<Split> open_split(MPI_Comm comm, const std::string& path, const std::string& split,
                                  std::int64_t context, bool cache, std::uint64_t cache_limit, RowBlock block) {
  const h5::InputScope scope(path);
  bool tokens = false;
  {
    const h5::File file = open_agreed(comm, path);
    agree(comm, [&] {
      const std::string group = "/" + split;
      tokens = h5::is_dataset(file, group + "/tokens");
      if (tokens || h5::is_dataset(file, group + "/inputs")) return;
      throw InputError(fmt::format(
          "{}: {} {}, expected datasets {}/inputs and {}/labels or {}/targets (a supervised split) "
          "or {}/tokens (a language split)", path,
          h5::is_group(file, group) ? "no dataset inputs or tokens in group" : "no group", group,
          group, group, group, group));
    });
  }
  if (tokens && block.parts > 1 && context % block.parts != 0)
    throw InputError(fmt::format("{}: /{}: parallel.spatial = {} cuts each window of model.context = {} tokens "
                                 "into equal blocks; set a context divisible by it", path, split, block.parts,
                                 context));
  if (tokens) return std::make_unique<TokenSplit>(comm, path, split, context, cache, cache_limit, block);
  return std::make_unique<SupervisedSplit>(comm, path, split, cache, cache_limit, block);
}

}  // namespace tessera::io
