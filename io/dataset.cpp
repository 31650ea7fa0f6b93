#include "io/dataset.hpp"

#include <algorithm>
#include <cstring>
#include <limits>
#include <numeric>
#include <optional>
#include <stdexcept>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/error.hpp"
#include "comm/agree.hpp"
#include "io/h5.hpp"
#include "comm/mpi_check.hpp"

namespace tessera::io {

namespace {

// Loads element k of a buffer of stored integers as int64.
using IntegerLoader = std::int64_t (*)(const std::uint8_t* raw, std::size_t k);

template <class T>
std::int64_t load_integer(const std::uint8_t* raw, std::size_t k) {
  T value;
  std::memcpy(&value, raw + k * sizeof(T), sizeof(T));
  return static_cast<std::int64_t>(value);
}

// The in-memory twin of a stored integer type (same size and sign: no conversion, so reads stay
// collective) and how to load one element of it.
struct IntegerType {
  hid_t mem = H5I_INVALID_HID;
  IntegerLoader load = nullptr;
};

std::optional<IntegerType> integer_type(hid_t file_type) {
  if (H5Tget_class(file_type) != H5T_INTEGER) return std::nullopt;
  const bool is_signed = H5Tget_sign(file_type) == H5T_SGN_2;
  switch (H5Tget_size(file_type)) {
    case 1: return is_signed ? IntegerType{H5T_NATIVE_INT8, load_integer<std::int8_t>}
                             : IntegerType{H5T_NATIVE_UINT8, load_integer<std::uint8_t>};
    case 2: return is_signed ? IntegerType{H5T_NATIVE_INT16, load_integer<std::int16_t>}
                             : IntegerType{H5T_NATIVE_UINT16, load_integer<std::uint16_t>};
    case 4: return is_signed ? IntegerType{H5T_NATIVE_INT32, load_integer<std::int32_t>}
                             : IntegerType{H5T_NATIVE_UINT32, load_integer<std::uint32_t>};
    case 8: return is_signed ? IntegerType{H5T_NATIVE_INT64, load_integer<std::int64_t>}
                             : IntegerType{H5T_NATIVE_UINT64, load_integer<std::uint64_t>};
    default: return std::nullopt;
  }
}

bool is_float32(hid_t type) { return H5Tget_class(type) == H5T_FLOAT && H5Tget_size(type) == 4; }
bool is_uint8(hid_t type) {
  return H5Tget_class(type) == H5T_INTEGER && H5Tget_size(type) == 1 &&
         H5Tget_sign(type) == H5T_SGN_NONE;
}

std::string shape_text(const std::vector<hsize_t>& dims) {
  return fmt::format("[{}]", fmt::join(dims, ","));
}

// One dataset read by rows: handle, file space, in-memory type and buffers.
struct Column {
  std::string name;  // "/train/inputs", for messages
  h5::Dataset dataset;
  h5::Dataspace file_space;
  std::vector<hsize_t> dims;
  hid_t mem_type = H5I_INVALID_HID;  // predefined type, not owned
  std::size_t row_bytes = 0;
  std::vector<std::uint8_t> cache;   // every row, when cached
  std::vector<std::uint8_t> buffer;  // the rows of the last read, in increasing row order

  std::int64_t rows() const { return static_cast<std::int64_t>(dims[0]); }
  std::size_t row_elems() const { return row_bytes / H5Tget_size(mem_type); }
};

// Opens dataset name (which must exist) and records its shape; the caller sets mem_type/row_bytes.
Column open_column(hid_t file, const std::string& name) {
  Column c;
  c.name = name;
  c.dataset = h5::Dataset(TESSERA_H5(H5Dopen2(file, name.c_str(), H5P_DEFAULT)));
  c.file_space = h5::Dataspace(TESSERA_H5(H5Dget_space(c.dataset)));
  c.dims = h5::dims(c.dataset);
  return c;
}

std::size_t row_elements(const std::vector<hsize_t>& dims) {
  return std::accumulate(dims.begin() + 1, dims.end(), std::size_t{1},
                         [](std::size_t a, hsize_t b) { return a * b; });
}

void select_range(Column& c, std::int64_t first, std::int64_t count) {
  if (count == 0) {
    TESSERA_H5(H5Sselect_none(c.file_space));
    return;
  }
  std::vector<hsize_t> start(c.dims.size(), 0), extent = c.dims;
  start[0] = static_cast<hsize_t>(first);
  extent[0] = static_cast<hsize_t>(count);
  TESSERA_H5(H5Sselect_hyperslab(c.file_space, H5S_SELECT_SET, start.data(), nullptr,
                                 extent.data(), nullptr));
}

// Selects the union of rows (sorted, unique), one hyperslab per run of consecutive rows.
void select_rows(Column& c, const std::vector<std::int64_t>& rows) {
  if (rows.empty()) {
    TESSERA_H5(H5Sselect_none(c.file_space));
    return;
  }
  std::vector<hsize_t> start(c.dims.size(), 0), extent = c.dims;
  H5S_seloper_t op = H5S_SELECT_SET;
  for (std::size_t i = 0; i < rows.size();) {
    std::size_t j = i;
    while (j + 1 < rows.size() && rows[j + 1] == rows[j] + 1) ++j;
    start[0] = static_cast<hsize_t>(rows[i]);
    extent[0] = static_cast<hsize_t>(j - i + 1);
    TESSERA_H5(H5Sselect_hyperslab(c.file_space, op, start.data(), nullptr, extent.data(),
                                   nullptr));
    op = H5S_SELECT_OR;
    i = j + 1;
  }
}

// Reads the selected nrows rows into c.buffer (collective when xfer says so).
void read_selected(Column& c, std::size_t nrows, hid_t xfer) {
  c.buffer.resize(nrows * c.row_bytes);
  hsize_t elems = std::max<hsize_t>(nrows * c.row_elems(), 1);
  h5::Dataspace mem(TESSERA_H5(H5Screate_simple(1, &elems, nullptr)));
  if (nrows == 0) TESSERA_H5(H5Sselect_none(mem));
  std::uint8_t dummy = 0;
  TESSERA_H5(H5Dread(c.dataset, c.mem_type, mem, c.file_space, xfer,
                     nrows > 0 ? c.buffer.data() : &dummy));
}

void fill_cache(Column& c, hid_t xfer) {
  c.cache.resize(static_cast<std::size_t>(c.rows()) * c.row_bytes);
  TESSERA_H5(H5Dread(c.dataset, c.mem_type, H5S_ALL, H5S_ALL, xfer, c.cache.data()));
}

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
  std::int64_t bad = n, bad_value = std::numeric_limits<std::int64_t>::min();
  for (std::int64_t k = 0; k < last - first && bad == n; ++k) {
    std::int64_t label = load_label(answers.buffer.data(), static_cast<std::size_t>(k));
    if (label < 0 || label >= info.classes) bad = first + k, bad_value = label;
  }
  std::int64_t first_bad = n, value = 0;
  MPI_CHECK(MPI_Allreduce(&bad, &first_bad, 1, MPI_INT64_T, MPI_MIN, comm));
  if (first_bad == n) return;
  if (bad != first_bad) bad_value = std::numeric_limits<std::int64_t>::min();
  MPI_CHECK(MPI_Allreduce(&bad_value, &value, 1, MPI_INT64_T, MPI_MAX, comm));
  throw InputError(fmt::format("{}: sample {} has label {}, expected 0 <= label < {}{}",
                               where(answers.name), first_bad, value, info.classes,
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
  // Collective calls, but each rank does its own MPI-IO read underneath: a batch's scattered rows
  // gain nothing from two-phase aggregation, and Open MPI 4.1.4's OMPIO returns zeros for some
  // rows of collective reads with data sieving on (open-mpi/ompi#10546; tests/mpi caught it).
  s.xfer = h5::collective_transfer();
  TESSERA_H5(H5Pset_dxpl_mpio_collective_opt(s.xfer, H5FD_MPIO_INDIVIDUAL_IO));
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

TokenSplit::TokenSplit(MPI_Comm comm, const std::string& path, const std::string& split,
                       std::int64_t context) {
  info_.file = path;
  info_.split = split;
  agree(comm, [&] {
    if (std::optional<std::string> why = h5::describe_unreadable(path)) throw InputError(*why);
  });
  h5::File file = h5::open_parallel(comm, path);
  h5::PropList xfer = h5::collective_transfer();
  TESSERA_H5(H5Pset_dxpl_mpio_collective_opt(xfer, H5FD_MPIO_INDIVIDUAL_IO));
  const std::string group = "/" + split, name = group + "/tokens";
  Column c;
  IntegerLoader load = nullptr;
  std::int64_t vocab = 0;
  agree(comm, [&] {
    if (!h5::is_dataset(file, name))
      throw InputError(fmt::format("{}: no dataset {} (a language dataset holds {}/tokens, written by "
                                   "`tessera prepare text`)", path, name, group));
    c = open_column(file, name);
    h5::Datatype type(TESSERA_H5(H5Dget_type(c.dataset)));
    const std::optional<IntegerType> integer = integer_type(type);
    if (!integer || c.dims.size() != 1)
      throw InputError(fmt::format("{}: dataset {} has type {} and shape {}, expected integer tokens [N]",
                                   path, name, h5::type_name(type), shape_text(c.dims)));
    c.mem_type = integer->mem;
    c.row_bytes = H5Tget_size(c.mem_type);
    load = integer->load;
    const std::optional<Attr> v = h5::find_attr(file, "vocab_size");
    const auto* value = v ? std::get_if<std::int64_t>(&*v) : nullptr;
    if (value == nullptr || *value < 1)
      throw InputError(fmt::format("{}: root attribute vocab_size is {}, expected a positive integer",
                                   path, v ? to_string(*v) : std::string("missing")));
    vocab = *value;
    if (c.rows() < context + 1)
      throw InputError(fmt::format("{}: dataset {} has {} tokens, fewer than one window of model.context "
                                   "= {} plus its next token", path, name, c.rows(), context));
  });
  fill_cache(c, xfer);
  agree(comm, [&] {
    tokens_.resize(static_cast<std::size_t>(c.rows()));
    for (std::size_t k = 0; k < tokens_.size(); ++k) {
      const std::int64_t t = load(c.cache.data(), k);
      if (t < 0 || t >= vocab)
        throw InputError(fmt::format("{}: dataset {} has token {} at position {}, expected 0 <= token < "
                                     "vocab_size = {}", path, name, t, k, vocab));
      tokens_[k] = static_cast<std::int32_t>(t);
    }
  });
  info_.samples = (c.rows() - 1) / context;
  info_.sample_shape = {context};
  info_.features = context;
  info_.has_labels = true;
  info_.classes = vocab;
  info_.label_width = context;
}

void TokenSplit::read(std::span<const std::int64_t> indices, float* inputs, std::int32_t* labels,
                      float* /*targets*/) {
  const auto ctx = static_cast<std::size_t>(info_.features);
  for (std::size_t i = 0; i < indices.size(); ++i) {
    const std::int64_t s = indices[i];
    if (s < 0 || s >= info_.samples)
      throw std::out_of_range(fmt::format("{}: /{}/tokens: sample index {} outside [0, {})", info_.file,
                                          info_.split, s, info_.samples));
    const std::int32_t* w = tokens_.data() + static_cast<std::size_t>(s) * ctx;
    for (std::size_t j = 0; j < ctx; ++j) {
      inputs[i * ctx + j] = static_cast<float>(w[j]);
      labels[i * ctx + j] = w[j + 1];
    }
  }
}

std::unique_ptr<Split> open_split(MPI_Comm comm, const std::string& path, const std::string& split,
                                  std::int64_t context, bool cache) {
  bool tokens = false;
  agree(comm, [&] {
    if (std::optional<std::string> why = h5::describe_unreadable(path)) throw InputError(*why);
  });
  {
    h5::File file = h5::open_parallel(comm, path);
    tokens = h5::is_dataset(file, "/" + split + "/tokens");
  }
  if (tokens) return std::make_unique<TokenSplit>(comm, path, split, context);
  return std::make_unique<SupervisedSplit>(comm, path, split, cache);
}

}  // namespace tessera::io
