#include "io/dataset.hpp"

#include <algorithm>
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

float numeric_attr(hid_t obj, const std::string& where, const char* name, float fallback) {
  std::optional<Attr> value = h5::find_attr(obj, name);
  if (!value) return fallback;
  if (const auto* d = std::get_if<double>(&*value)) return static_cast<float>(*d);
  if (const auto* i = std::get_if<std::int64_t>(&*value)) return static_cast<float>(*i);
  throw InputError(fmt::format("{}: attribute {} is a string, expected a number", where, name));
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
  // Plan of the current read: positions sorted by index, unique rows, row slot of each position.
  std::vector<std::size_t> order, slot;
  std::vector<std::int64_t> rows;

  std::string where(const std::string& dataset) const {
    return fmt::format("{}: dataset {}", info.file, dataset);
  }
  void open_inputs();
  void open_answers();
  void scan_labels();
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
      if (value == nullptr || *value <= 0) {
        throw InputError(fmt::format("{}: attribute classes is {}, expected a positive integer",
                                     where(name), to_string(*classes)));
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
  }
  answers.row_bytes = row_elements(answers.dims) * H5Tget_size(answers.mem_type);
  if (answers.rows() != inputs.rows()) {
    throw InputError(fmt::format("{} has {} rows but {} has {}", where(name), answers.rows(),
                                 inputs.name, inputs.rows()));
  }
}

// Collective: each rank reads a slice of the labels; every rank learns classes (if no attribute
// gave it) and throws the same InputError if any label is outside [0, classes).
void SupervisedSplit::Impl::scan_labels() {
  int rank = 0, size = 1;
  MPI_CHECK(MPI_Comm_rank(comm, &rank));
  MPI_CHECK(MPI_Comm_size(comm, &size));
  const std::int64_t n = info.samples;
  const std::int64_t first = n * rank / size, last = n * (rank + 1) / size;
  select_range(answers, first, last - first);
  read_selected(answers, static_cast<std::size_t>(last - first), xfer);

  const bool from_attr = info.classes > 0;
  if (!from_attr) {
    std::int64_t local_max = std::numeric_limits<std::int64_t>::min();
    for (std::int64_t k = 0; k < last - first; ++k)
      local_max = std::max(local_max, load_label(answers.buffer.data(), static_cast<std::size_t>(k)));
    MPI_CHECK(MPI_Allreduce(&local_max, &info.classes, 1, MPI_INT64_T, MPI_MAX, comm));
    info.classes = std::max<std::int64_t>(info.classes + 1, 1);
  }
  std::optional<Found> bad;
  for (std::int64_t k = 0; k < last - first && !bad; ++k) {
    std::int64_t label = load_label(answers.buffer.data(), static_cast<std::size_t>(k));
    if (label < 0 || label >= info.classes) bad = Found{first + k, label};
  }
  bad = first_found(comm, bad);
  if (!bad) return;
  throw InputError(fmt::format("{}: sample {} has label {}, expected 0 <= label < {}{}",
                               where(answers.name), bad->position, bad->value, info.classes,
                               from_attr ? " (attribute classes)" : ""));
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
  slot.resize(indices.size());
  for (std::size_t position : order) {
    if (rows.empty() || rows.back() != indices[position]) rows.push_back(indices[position]);
    slot[position] = rows.size() - 1;
  }
}

SupervisedSplit::SupervisedSplit(MPI_Comm comm, const std::string& path, const std::string& split,
                                 bool cache)
    : impl_(std::make_unique<Impl>()) {
  Impl& s = *impl_;
  s.comm = comm;
  s.info.file = path;
  s.info.split = split;
  s.cached = cache;
  agree(comm, [&] {
    if (std::optional<std::string> why = h5::describe_unreadable(path)) throw InputError(*why);
  });
  s.file = h5::open_parallel(comm, path);
  s.xfer = read_transfer();
  agree(comm, [&] {
    s.open_inputs();
    s.open_answers();
  });
  if (s.info.has_labels) s.scan_labels();
  if (cache) {
    fill_cache(s.inputs, s.xfer);
    fill_cache(s.answers, s.xfer);
  }
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

  // Fetch the unique rows, in increasing order, collectively.
  if (!s.cached) {
    for (Column* c : {&s.inputs, &s.answers}) {
      select_rows(*c, s.rows);
      read_selected(*c, s.rows.size(), s.xfer);
    }
  }

  // Scatter to the caller's order, mapping inputs to x*scale + offset.
  const auto features = static_cast<std::size_t>(s.info.features);
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
      std::int64_t label = s.load_label(answer, 0);
      if (label < 0 || label >= s.info.classes) {
        // Checked when the split was opened: the file changed underneath us.
        throw std::runtime_error(fmt::format("{}: sample {} has label {}, expected < {}",
                                             s.where(s.answers.name), indices[i], label,
                                             s.info.classes));
      }
      labels[i] = static_cast<std::int32_t>(label);
    } else {
      std::memcpy(targets + i * static_cast<std::size_t>(s.info.target_width), answer,
                  s.answers.row_bytes);
    }
  }
}

std::unique_ptr<Split> open_split(MPI_Comm comm, const std::string& path, const std::string& split,
                                  std::int64_t context, bool cache) {
  agree(comm, [&] {
    if (std::optional<std::string> why = h5::describe_unreadable(path)) throw InputError(*why);
  });
  bool tokens = false;
  {
    const h5::File file = h5::open_parallel(comm, path);
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
  if (tokens) return std::make_unique<TokenSplit>(comm, path, split, context, cache);
  return std::make_unique<SupervisedSplit>(comm, path, split, cache);
}

}  // namespace tessera::io
