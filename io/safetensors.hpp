#pragma once
// The safetensors format (Hugging Face's): an 8-byte little-endian header length N, N bytes of
// JSON ({"name": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, ...,
// "__metadata__": {string: string}}), then the tensors' raw little-endian bytes, offsets counted
// from the end of the header. Written and read here without a library (the format is that small);
// every field of a file being read is checked before a byte of data is used. No HDF5 here.
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace tessera::io {

/// A float32 tensor in row-major order (values.size() == product(shape)).
struct NamedTensor {
  std::string name;
  std::vector<std::uint64_t> shape;
  std::vector<float> values;
};

/// \brief Writes tensors (F32, in the order given) and metadata to path, through path.tmp renamed
/// into place: nothing is left at path on failure. InputError naming the file where it cannot be
/// written. Local (one rank).
void write_safetensors(const std::string& path, const std::vector<NamedTensor>& tensors,
                       const std::map<std::string, std::string>& metadata);

/// One tensor of a safetensors header.
struct SafetensorsEntry {
  std::string name;
  std::string dtype;                  ///< "F32", "F16", "BF16" or "F64" (others are refused)
  std::vector<std::uint64_t> shape;
  std::uint64_t begin = 0, end = 0;   ///< byte offsets into the data section
};

/// \brief A safetensors file open for reading; local (one rank, or each rank alike).
class SafetensorsFile {
 public:
  /// \brief Reads and checks the header: its length within the file (and at most 100 MiB), JSON
  /// that parses to an object, each tensor's dtype (F32, F16, BF16, F64: the ones that convert
  /// to float32), shape and offsets (inside the data, the byte count of its shape, no two
  /// tensors overlapping), __metadata__ strings. InputError naming the file and the first problem.
  explicit SafetensorsFile(std::string path);

  const std::string& path() const { return path_; }
  /// The tensors, ordered by name.
  const std::vector<SafetensorsEntry>& entries() const { return entries_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  /// The entry called name, or nullptr.
  const SafetensorsEntry* find(const std::string& name) const;
  /// \brief The values of an entry as float32 (converted from its dtype). InputError naming the
  /// file and tensor where it cannot be read or holds a NaN, an infinity, or (F64) a value beyond
  /// float32's range.
  std::vector<float> read(const SafetensorsEntry& entry) const;

 private:
  std::string path_;
  std::uint64_t data_start_ = 0;  ///< 8 + header length
  std::vector<SafetensorsEntry> entries_;
  std::map<std::string, std::string> metadata_;
};

/// \brief A model's safetensors as one set of tensors: a single file, or the shards a Hugging
/// Face index names (model.safetensors.index.json: {"metadata": {...}, "weight_map": {tensor:
/// shard file}}, the shards in the index's directory). Local (one rank, or each rank alike); only
/// the headers are read on construction, a tensor's bytes when it is read.
class SafetensorsModel {
 public:
  /// \brief path: a safetensors file; an index (a name ending in .json); or a directory holding
  /// model.safetensors.index.json or else model.safetensors. Opens every shard as SafetensorsFile
  /// and checks the index against them: JSON, an object, a non-empty weight_map of tensor names
  /// to plain file names (no directory part), each tensor in the shard it is mapped to, each
  /// tensor of a shard mapped to it, the shards' __metadata__ agreeing. InputError naming the
  /// index (or the shard) and the first problem.
  explicit SafetensorsModel(const std::string& path);

  /// The file, or the index (a directory resolved to the one it holds).
  const std::string& path() const { return path_; }
  /// Whether path() is an index of shards.
  bool sharded() const { return index_; }
  /// Every shard's tensors, ordered by name.
  const std::vector<SafetensorsEntry>& entries() const { return entries_; }
  /// The shards' __metadata__ (equal keys equal across shards).
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  /// The entry called name, or nullptr.
  const SafetensorsEntry* find(const std::string& name) const;
  /// \brief The values of an entry of entries() as float32, read from its shard (as
  /// SafetensorsFile::read, whose errors name the shard).
  std::vector<float> read(const SafetensorsEntry& entry) const;

 private:
  std::string path_;
  bool index_ = false;
  std::vector<SafetensorsFile> files_;
  std::vector<SafetensorsEntry> entries_;
  std::vector<std::size_t> file_of_;  ///< entries_[i] lies in files_[file_of_[i]]
  std::map<std::string, std::string> metadata_;
};

}  // namespace tessera::io
