#pragma once
// A serial writer of plain HDF5 files: typed arrays and scalar attributes. Used to write datasets
// (`tessera prepare`) and, in tests, files of any shape and type, valid or not.
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "io/attr.hpp"

namespace tessera::io {

/// Element types a DatasetWriter stores.
enum class ElementType { uint8, int8, uint16, int16, int32, int64, float32, float64 };

/// \brief The ElementType of a C++ arithmetic type.
template <class T>
constexpr ElementType element_type_of() {
  if constexpr (std::is_same_v<T, std::uint8_t>) return ElementType::uint8;
  else if constexpr (std::is_same_v<T, std::int8_t>) return ElementType::int8;
  else if constexpr (std::is_same_v<T, std::uint16_t>) return ElementType::uint16;
  else if constexpr (std::is_same_v<T, std::int16_t>) return ElementType::int16;
  else if constexpr (std::is_same_v<T, std::int32_t>) return ElementType::int32;
  else if constexpr (std::is_same_v<T, std::int64_t>) return ElementType::int64;
  else if constexpr (std::is_same_v<T, float>) return ElementType::float32;
  else {
    static_assert(std::is_same_v<T, double>, "unsupported element type");
    return ElementType::float64;
  }
}

/// \brief Writes one HDF5 file serially (default driver). Not collective: call it from one
/// process, e.g. rank 0, and let the others wait at a barrier.
class DatasetWriter {
 public:
  /// \brief Creates or truncates path (its directory must exist).
  explicit DatasetWriter(const std::string& path);
  ~DatasetWriter();
  DatasetWriter(const DatasetWriter&) = delete;
  DatasetWriter& operator=(const DatasetWriter&) = delete;

  /// \brief Writes a contiguous dataset of shape `shape` from row-major data; parent groups
  /// ("/train" for "/train/inputs") are created as needed. data.size() must equal product(shape).
  template <class T>
  void write(const std::string& dataset, const std::vector<std::uint64_t>& shape,
             std::span<const T> data) {
    write_raw(dataset, element_type_of<T>(), shape, data.data(), data.size());
  }
  /// \brief Creates an (empty) group and its parents.
  void create_group(const std::string& group);
  /// \brief Writes an attribute on the group or dataset at `object` ("/" is the root).
  void write_attr(const std::string& object, const std::string& name, const Attr& value);
  /// \brief Writes a float32 attribute on the group or dataset at `object`.
  void write_float_attr(const std::string& object, const std::string& name, float value);
  /// \brief Closes the file, reporting any failure to flush it.
  void close();

 private:
  void write_raw(const std::string& dataset, ElementType type,
                 const std::vector<std::uint64_t>& shape, const void* data, std::size_t count);
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tessera::io
