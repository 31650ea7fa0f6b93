#pragma once
// One HDF5 dataset read by rows along its first dimension: what the dataset readers
// (SupervisedSplit, TokenSplit) share. Internal to io/: it includes hdf5.h through io/h5.hpp.
#include <mpi.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "io/h5.hpp"

namespace tessera::io {

/// Loads element k of a buffer of stored integers as int64.
using IntegerLoader = std::int64_t (*)(const std::uint8_t* raw, std::size_t k);

/// The in-memory twin of a stored integer type (same size and sign: no conversion, so reads stay
/// collective) and how to load one element of it.
struct IntegerType {
  hid_t mem = H5I_INVALID_HID;  ///< predefined type, not owned
  IntegerLoader load = nullptr;
};

/// \brief The IntegerType of a stored type of class H5T_INTEGER (any size of 1, 2, 4 or 8 bytes,
/// signed or not); nullopt for anything else.
std::optional<IntegerType> integer_type(hid_t file_type);
bool is_float32(hid_t type);
bool is_uint8(hid_t type);
/// \brief "[60000,28,28]".
std::string shape_text(const std::vector<hsize_t>& dims);

/// \brief A run of rows along the first dimension: [first, first + count).
struct RowRange {
  std::int64_t first = 0, count = 0;
};

/// \brief One dataset read by rows: handle, file space, in-memory type and buffers.
struct Column {
  std::string name;  ///< "/train/inputs", for messages
  h5::Dataset dataset;
  h5::Dataspace file_space;
  std::vector<hsize_t> dims;
  hid_t mem_type = H5I_INVALID_HID;  ///< predefined type, not owned; set by the caller
  std::size_t row_bytes = 0;         ///< set by the caller
  std::vector<std::uint8_t> cache;   ///< every row, when cached
  std::vector<std::uint8_t> buffer;  ///< the rows of the last read, in increasing row order
  /// Where reads take only a block of each row: indices [block_begin, block_begin + block_count)
  /// along axis block_axis (> 0) and the whole of every other axis; -1: whole rows. row_bytes is
  /// then the block's bytes.
  int block_axis = -1;
  hsize_t block_begin = 0, block_count = 0;

  std::int64_t rows() const { return static_cast<std::int64_t>(dims[0]); }
  std::size_t row_elems() const { return row_bytes / H5Tget_size(mem_type); }
};

/// \brief Makes reads of c take only indices [begin, begin + count) along `axis` (> 0) of each
/// row; returns the elements of one row's block (the caller sets row_bytes from it).
std::size_t set_block(Column& c, int axis, hsize_t begin, hsize_t count);

/// \brief Opens dataset name (which must exist) and records its shape; the caller sets mem_type
/// and row_bytes. Fails (h5::fail_with) where the dataset does not store what its shape declares
/// (h5::check_storage) or its size in bytes would not fit in 63 bits.
Column open_column(hid_t file, const std::string& name);
/// \brief Elements per row: the product of dims without the first.
std::size_t row_elements(const std::vector<hsize_t>& dims);

/// \brief The ranges (sorted, disjoint) with the smallest gaps between them merged until at most
/// max_ranges remain. HDF5 1.10 builds a union of n hyperslabs in O(n^2) time (a batch of 30000
/// scattered rows took 34 s to select), so a read of many scattered rows reads the few rows
/// between them too.
std::vector<RowRange> coalesce(const std::vector<RowRange>& ranges, std::size_t max_ranges);

/// The most hyperslabs one read selects (coalesce()).
inline constexpr std::size_t kMaxReadRanges = 64;

/// \brief Where the rows of a read of `ranges` (sorted, disjoint) land in the buffer it fills.
class RangeIndex {
 public:
  explicit RangeIndex(std::vector<RowRange> ranges);
  const std::vector<RowRange>& ranges() const { return ranges_; }
  /// Rows in all the ranges.
  std::int64_t total() const { return starts_.empty() ? 0 : starts_.back() + ranges_.back().count; }
  /// \brief The buffer row of `row`, which must lie in one of the ranges.
  std::int64_t position(std::int64_t row) const;

 private:
  std::vector<RowRange> ranges_;
  std::vector<std::int64_t> starts_;  ///< buffer row of each range's first row
};

/// \brief Selects rows [first, first + count) (nothing when count is 0).
void select_range(Column& c, std::int64_t first, std::int64_t count);
/// \brief Selects the union of ranges, which must be sorted and disjoint: one hyperslab each.
void select_ranges(Column& c, const std::vector<RowRange>& ranges);
/// \brief Reads the nrows selected rows into c.buffer, in increasing row order. Collective when
/// xfer says so: every rank of the file's communicator calls it, nrows possibly 0.
void read_selected(Column& c, std::size_t nrows, hid_t xfer);
/// \brief Reads every row into c.cache (collective when xfer says so).
void fill_cache(Column& c, hid_t xfer);

/// \brief A value found at a position (of a sample, a token), e.g. the first one out of range.
struct Found {
  std::int64_t position = 0, value = 0;
};

/// \brief The entry with the smallest position over every rank of comm (each rank passes what it
/// found in its share, or nullopt), or nullopt when no rank found one: the same on every rank.
/// Collective: every rank of comm calls it.
std::optional<Found> first_found(MPI_Comm comm, std::optional<Found> mine);

/// \brief Opens the file at path read-only on every rank of comm, after h5::check_openable (it
/// exists and is HDF5 on every rank, its metadata reads in rank 0's sandbox; else every rank
/// throws the same InputError naming it).
h5::File open_agreed(MPI_Comm comm, const std::string& path);

/// \brief The transfer list of the dataset readers: independent reads, each rank its own MPI-IO
/// read. A batch's scattered rows gain nothing from two-phase aggregation, Open MPI 4.1.4's OMPIO
/// returns zeros for some rows of collective reads with data sieving on (open-mpi/ompi#10546;
/// tests/mpi caught it), and a read that fails on one rank (a damaged chunk) must not leave the
/// others inside a collective: the readers agree on the outcome after each read (comm/agree.hpp).
h5::PropList read_transfer();

}  // namespace tessera::io
