#pragma once
// The checkpoint HDF5 file (DESIGN.md "Checkpoints"): written collectively, each rank its own
// hyperslab of every tensor, through a temporary file renamed into place; read back by hyperslab
// in any other layout.
#include <mpi.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/counted_buffer.hpp"
#include "io/attr.hpp"

namespace tessera::io {

struct TensorCheck;

/// This rank's part of one float32 tensor.
struct TensorSlab {
  std::string path;                   ///< "model/layers.0.weight", "optimizer/layers.0.weight/momentum"
  std::vector<std::uint64_t> shape;   ///< full logical shape, rank >= 1
  std::vector<std::uint64_t> offset;  ///< this rank's hyperslab start
  std::vector<std::uint64_t> count;   ///< this rank's hyperslab size; a zero anywhere: writes nothing
  const float* data = nullptr;        ///< product(count) floats, row-major, host memory
  /// Instead of all of (offset, count): its row-major elements [first, last) (a ZeRO shard's
  /// piece of this rank's block), data holding last - first floats.
  bool by_elements = false;
  std::uint64_t first = 0, last = 0;
  /// Instead of data (nullptr): writes the slab's elements() into its argument, where they are
  /// needed (a save reads it once for the checksum and the write), one slab at a time: a state kept on disk
  /// is never in memory whole.
  std::function<void(float* out)> fill{};
  /// The slab's elements: last - first, or product(count).
  std::uint64_t elements() const;
};

/// \brief t itself, or where it has a fill and no data, a copy whose data is t's elements, read
/// into `buffer` (which must outlive the copy's use). Made with mem::Category::param, the buffer
/// counts a save's transient (one tensor at a time, the largest's size) in the run's peak.
TensorSlab materialized(const TensorSlab& t, CountedBuffer& buffer);

/// Everything a checkpoint holds.
struct CheckpointContent {
  std::map<std::string, Attr> root_attrs;  ///< the writer adds format and format_version
  std::map<std::string, std::map<std::string, Attr>> group_attrs;  ///< {"optimizer": {kind, step}}
  std::vector<TensorSlab> tensors;  ///< float32 datasets; groups are created as needed
};

/// The value of the root attribute `format` of a checkpoint.
inline constexpr const char* kCheckpointFormat = "tessera-checkpoint";
/// The layout version this code writes; it reads 1 and 2. Version 2 adds, on every tensor, the
/// attribute `checksum` (uint64: io/tensor_check.hpp's sum over the whole tensor) and the 1.10 file
/// format, whose metadata HDF5 checksums itself.
inline constexpr std::int64_t kCheckpointFormatVersion = 2;
/// The attribute of each tensor that holds its checksum (format_version >= 2).
inline constexpr const char* kChecksumAttribute = "checksum";

/// \brief Writes a checkpoint to final_path. Must be called on every rank of comm with the same
/// attributes and the same tensor list (paths, shapes, order), each rank with its own offset and
/// count, the slabs together covering every element once (the checksums add them up). Rank 0
/// creates the parent directory; all ranks write final_path + ".tmp" with the MPI-IO driver and
/// collective transfers; rank 0 fsyncs it, renames it to final_path and fsyncs the directory;
/// every rank returns after the rename. A crash mid-write leaves only the .tmp file. Errors are
/// thrown on every rank alike (an InputError naming the file where it cannot be written).
void write_checkpoint(MPI_Comm comm, const std::string& final_path,
                      const CheckpointContent& content);

/// \brief final_path + ".tmp": where a checkpoint is written before it is renamed into place.
std::string temporary_path(const std::string& final_path);

/// \brief The first half of an asynchronous save (checkpoint.async): creates temporary_path(
/// final_path) with every attribute and every tensor's dataset (its checksum attribute included,
/// computed from the slabs as write_checkpoint does) and its storage allocated but not written,
/// and returns each tensor's byte offset in the file (contiguous float32 little-endian), for
/// io::TensorFileWriter. Collective as write_checkpoint; errors on every rank alike.
std::vector<std::uint64_t> create_checkpoint_layout(MPI_Comm comm, const std::string& final_path,
                                                    const CheckpointContent& content);

/// \brief The last step of a save: rank 0 fsyncs temporary_path(final_path), renames it to
/// final_path and fsyncs the directory; every rank returns after the rename (errors on all).
/// Call only once every rank's part is written and synced.
void commit_checkpoint(MPI_Comm comm, const std::string& final_path);

/// \brief A checkpoint open for reading with the MPI-IO driver.
class CheckpointFile {
 public:
  /// \brief Opens path. Must be called on every rank of comm. InputError naming the file (on every
  /// rank) if it is missing, not HDF5, not a Tessera checkpoint or of a newer format_version.
  CheckpointFile(MPI_Comm comm, const std::string& path);
  ~CheckpointFile();
  CheckpointFile(CheckpointFile&&) noexcept;
  CheckpointFile& operator=(CheckpointFile&&) noexcept;

  const std::string& path() const;
  /// The communicator it was opened on.
  MPI_Comm comm() const;
  /// \brief The root attribute format_version (1 or 2). Local.
  std::int64_t format_version() const;
  /// \brief The root attributes. Local: any rank may call it alone.
  std::map<std::string, Attr> root_attrs() const;
  /// \brief The attributes of a group ("optimizer", "train"); empty if there is no such group. Local.
  std::map<std::string, Attr> group_attrs(const std::string& group) const;
  /// \brief True if dataset_path ("model/layers.0.weight") is a dataset. Local.
  bool has(const std::string& dataset_path) const;
  /// \brief The shape of a dataset; InputError naming file and dataset if it is absent. Local.
  std::vector<std::uint64_t> shape(const std::string& dataset_path) const;
  /// \brief Dataset paths under group ("" for all), recursive, sorted: "model/layers.0.bias", ...
  std::vector<std::string> list(const std::string& group) const;
  /// \brief Reads the hyperslab (offset, count) of a float dataset into out (product(count)
  /// floats, row-major). Must be called on every rank of comm, each with its own hyperslab; a
  /// count with a zero reads nothing. InputError on every rank if any rank's dataset is absent, not
  /// float, or its hyperslab does not fit the dataset's shape.
  void read(const std::string& dataset_path, std::span<const std::uint64_t> offset,
            std::span<const std::uint64_t> count, float* out) const;
  /// \brief Reads the row-major elements [first, last) of the hyperslab (offset, count) of a
  /// float dataset into out; collective as read(), each rank with its own range (empty reads
  /// nothing).
  void read_elements(const std::string& dataset_path, std::span<const std::uint64_t> offset,
                     std::span<const std::uint64_t> count, std::uint64_t first, std::uint64_t last,
                     float* out) const;
  /// \brief Checks what the ranks read: the parts of each tensor (every rank's parts of a tensor
  /// together covering each element once) add up to the checksum stored with it, and no value is
  /// NaN or infinite (a checkpoint never holds one). Must be called on every rank of comm with the
  /// same tensor paths in the same order. InputError on every rank naming the file and the first
  /// tensor that fails; a version-2 tensor without a checksum fails too.
  void verify(const std::vector<TensorCheck>& parts) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tessera::io
