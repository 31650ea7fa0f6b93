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

}  // namespace tessera::io
