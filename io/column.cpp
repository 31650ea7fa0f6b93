#include "io/column.hpp"

#include <algorithm>
#include <cstring>
#include <limits>
#include <numeric>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "comm/agree.hpp"
#include "comm/mpi_check.hpp"
#include "core/error.hpp"
#include "io/h5_probe.hpp"

namespace tessera::io {

namespace {

template <class T>
std::int64_t load_integer(const std::uint8_t* raw, std::size_t k) {
  T value;
  std::memcpy(&value, raw + k * sizeof(T), sizeof(T));
  return static_cast<std::int64_t>(value);
}

}  // namespace

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

bool is_float32(hid_t type) { return h5::is_ieee_float(type) && H5Tget_size(type) == 4; }

bool is_uint8(hid_t type) {
  return H5Tget_class(type) == H5T_INTEGER && H5Tget_size(type) == 1 &&
         H5Tget_sign(type) == H5T_SGN_NONE;
}

std::string shape_text(const std::vector<hsize_t>& dims) {
  return fmt::format("[{}]", fmt::join(dims, ","));
}

Column open_column(hid_t file, const std::string& name) {
  Column c;
  c.name = name;
  c.dataset = h5::Dataset(TESSERA_H5(H5Dopen2(file, name.c_str(), H5P_DEFAULT)));
  c.file_space = h5::Dataspace(TESSERA_H5(H5Dget_space(c.dataset)));
  c.dims = h5::dims(c.dataset);
  h5::check_storage(c.dataset, name);
  return c;
}

std::size_t row_elements(const std::vector<hsize_t>& dims) {
  return std::accumulate(dims.begin() + 1, dims.end(), std::size_t{1},
                         [](std::size_t a, hsize_t b) { return a * b; });
}

std::vector<RowRange> coalesce(const std::vector<RowRange>& ranges, std::size_t max_ranges) {
  if (ranges.size() <= max_ranges || max_ranges == 0) return ranges;
  // Merge every gap below the (n - max)-th smallest, and as many equal to it as needed.
  std::vector<std::int64_t> gaps(ranges.size() - 1);
  for (std::size_t i = 0; i + 1 < ranges.size(); ++i)
    gaps[i] = ranges[i + 1].first - (ranges[i].first + ranges[i].count);
  std::vector<std::int64_t> sorted = gaps;
  const std::size_t merges = ranges.size() - max_ranges;
  std::nth_element(sorted.begin(), sorted.begin() + static_cast<std::ptrdiff_t>(merges - 1), sorted.end());
  const std::int64_t threshold = sorted[merges - 1];
  std::size_t below = 0;
  for (std::int64_t g : gaps) below += g < threshold ? 1 : 0;
  std::size_t equal_left = merges - below;
  std::vector<RowRange> out{ranges.front()};
  for (std::size_t i = 0; i + 1 < ranges.size(); ++i) {
    const bool merge = gaps[i] < threshold || (gaps[i] == threshold && equal_left > 0);
    if (merge && gaps[i] == threshold) --equal_left;
    if (merge) out.back().count = ranges[i + 1].first + ranges[i + 1].count - out.back().first;
    else out.push_back(ranges[i + 1]);
  }
  return out;
}

RangeIndex::RangeIndex(std::vector<RowRange> ranges) : ranges_(std::move(ranges)) {
  std::int64_t at = 0;
  for (const RowRange& r : ranges_) {
    starts_.push_back(at);
    at += r.count;
  }
}

std::int64_t RangeIndex::position(std::int64_t row) const {
  // The last range starting at or before row.
  const auto it = std::upper_bound(ranges_.begin(), ranges_.end(), row,
                                   [](std::int64_t r, const RowRange& range) { return r < range.first; });
  const auto k = static_cast<std::size_t>(it - ranges_.begin()) - 1;
  return starts_[k] + row - ranges_[k].first;
}

void select_range(Column& c, std::int64_t first, std::int64_t count) {
  if (count == 0) {
    TESSERA_H5(H5Sselect_none(c.file_space));
    return;
  }
  select_ranges(c, {RowRange{first, count}});
}

std::size_t set_block(Column& c, int axis, hsize_t begin, hsize_t count) {
  c.block_axis = axis;
  c.block_begin = begin;
  c.block_count = count;
  return row_elements(c.dims) / static_cast<std::size_t>(c.dims[static_cast<std::size_t>(axis)]) *
         static_cast<std::size_t>(count);
}

void select_ranges(Column& c, const std::vector<RowRange>& ranges) {
  if (ranges.empty()) {
    TESSERA_H5(H5Sselect_none(c.file_space));
    return;
  }
  std::vector<hsize_t> start(c.dims.size(), 0), extent = c.dims;
  if (c.block_axis > 0) {
    start[static_cast<std::size_t>(c.block_axis)] = c.block_begin;
    extent[static_cast<std::size_t>(c.block_axis)] = c.block_count;
  }
  H5S_seloper_t op = H5S_SELECT_SET;
  for (const RowRange& range : ranges) {
    start[0] = static_cast<hsize_t>(range.first);
    extent[0] = static_cast<hsize_t>(range.count);
    TESSERA_H5(H5Sselect_hyperslab(c.file_space, op, start.data(), nullptr, extent.data(),
                                   nullptr));
    op = H5S_SELECT_OR;
  }
}

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
  if (c.block_axis < 0) {
    TESSERA_H5(H5Dread(c.dataset, c.mem_type, H5S_ALL, H5S_ALL, xfer, c.cache.data()));
    return;
  }
  // This rank's block of every row.
  select_ranges(c, {RowRange{0, c.rows()}});
  const hsize_t elems = static_cast<hsize_t>(c.rows()) * c.row_elems();
  h5::Dataspace memory(TESSERA_H5(H5Screate_simple(1, &elems, nullptr)));
  TESSERA_H5(H5Dread(c.dataset, c.mem_type, memory, c.file_space, xfer, c.cache.data()));
}

std::optional<Found> first_found(MPI_Comm comm, std::optional<Found> mine) {
  constexpr std::int64_t none = std::numeric_limits<std::int64_t>::max();
  constexpr std::int64_t lowest = std::numeric_limits<std::int64_t>::min();
  const std::int64_t position = mine ? mine->position : none;
  Found first;
  MPI_CHECK(MPI_Allreduce(&position, &first.position, 1, MPI_INT64_T, MPI_MIN, comm));
  if (first.position == none) return std::nullopt;
  // Only the rank (or ranks: the same file, the same value) that found it contributes its value.
  const std::int64_t value = position == first.position ? mine->value : lowest;
  MPI_CHECK(MPI_Allreduce(&value, &first.value, 1, MPI_INT64_T, MPI_MAX, comm));
  return first;
}

h5::File open_agreed(MPI_Comm comm, const std::string& path) {
  h5::check_openable(comm, path);
  return h5::open_parallel(comm, path);
}

h5::PropList read_transfer() { return h5::independent_transfer(); }

}  // namespace tessera::io
