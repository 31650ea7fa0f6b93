#pragma once
// The thin layer over the HDF5 C API that the rest of io/ is written in: a check macro that
// records file and line, RAII handles for every kind of hid_t, attribute helpers and file openers.
// Only io/*.cpp include this header; nothing outside io/ sees hdf5.h.
#include <hdf5.h>
#include <mpi.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "io/attr.hpp"

namespace tessera::io::h5 {

/// \brief Throws std::runtime_error naming expr, file, line and HDF5's innermost error message.
[[noreturn]] void fail(const char* expr, const char* file, int line);

/// \brief Returns value if it is not negative (HDF5's failure convention), else calls fail().
template <class T>
T check(T value, const char* expr, const char* file, int line) {
  if (value < 0) fail(expr, file, line);
  return value;
}

/// \brief Turns HDF5's automatic error-stack printing off, so users see only our messages.
/// Idempotent; every opener below calls it.
void silence_errors();

}  // namespace tessera::io::h5

/// Checks an HDF5 call that returns herr_t, htri_t or hid_t and yields its value.
#define TESSERA_H5(expr) ::tessera::io::h5::check((expr), #expr, __FILE__, __LINE__)

namespace tessera::io::h5 {

/// \brief Owns one hid_t and closes it with Close; move-only.
template <herr_t (*Close)(hid_t)>
class Handle {
 public:
  Handle() = default;
  explicit Handle(hid_t id) : id_(id) {}
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  Handle(Handle&& other) noexcept : id_(std::exchange(other.id_, H5I_INVALID_HID)) {}
  Handle& operator=(Handle&& other) noexcept {
    if (this != &other) {
      reset();
      id_ = std::exchange(other.id_, H5I_INVALID_HID);
    }
    return *this;
  }
  ~Handle() { reset(); }

  hid_t get() const { return id_; }
  operator hid_t() const { return id_; }  // NOLINT: lets handles pass straight to H5* calls
  bool valid() const { return id_ >= 0; }

  /// \brief Closes now; a failed close of a file (lost data) throws.
  void close() {
    if (id_ >= 0) TESSERA_H5(Close(std::exchange(id_, H5I_INVALID_HID)));
  }

 private:
  void reset() noexcept {
    if (id_ >= 0) Close(std::exchange(id_, H5I_INVALID_HID));
  }
  hid_t id_ = H5I_INVALID_HID;
};

using File = Handle<H5Fclose>;
using Group = Handle<H5Gclose>;
using Dataset = Handle<H5Dclose>;
using Dataspace = Handle<H5Sclose>;
using Datatype = Handle<H5Tclose>;
using PropList = Handle<H5Pclose>;
using Attribute = Handle<H5Aclose>;
using Object = Handle<H5Oclose>;

// --- Files ---------------------------------------------------------------------------------

/// \brief File access list using the MPI-IO driver on comm.
PropList mpio_access(MPI_Comm comm);
/// \brief Transfer list for collective MPI-IO reads and writes (H5FD_MPIO_COLLECTIVE).
PropList collective_transfer();

/// \brief Opens an existing file read-only with the MPI-IO driver.
/// Must be called on every rank of comm. Failure throws std::runtime_error; callers check
/// existence and format first (describe_unreadable()) to turn user mistakes into InputError.
File open_parallel(MPI_Comm comm, const std::string& path);
/// \brief Creates (truncates) a file with the MPI-IO driver. Must be called on every rank of comm.
File create_parallel(MPI_Comm comm, const std::string& path);
/// \brief Opens an existing file read-only with the default (serial) driver.
File open_serial(const std::string& path);
/// \brief Creates (truncates) a file with the default (serial) driver.
File create_serial(const std::string& path);

/// \brief Why path cannot be opened as HDF5 ("path: no such file", "path: not an HDF5 file"), or
/// nullopt when it can. Local and cheap: no collective.
std::optional<std::string> describe_unreadable(const std::string& path);

// --- Objects -------------------------------------------------------------------------------

/// \brief True if the object at path (e.g. "model/layers.0.weight") exists, checking each link.
bool exists(hid_t loc, const std::string& path);
/// \brief True if path names a dataset (false for groups and for absent paths).
bool is_dataset(hid_t loc, const std::string& path);
/// \brief True if path names a group.
bool is_group(hid_t loc, const std::string& path);
/// \brief Link creation list that creates missing intermediate groups.
PropList intermediate_groups();
/// \brief Opens the group at path, creating it (and its parents) if absent.
Group open_or_create_group(hid_t loc, const std::string& path);
/// \brief The dimensions of a dataset.
std::vector<hsize_t> dims(hid_t dataset);
/// \brief Dataset paths under group, recursive, relative to the file root, sorted.
std::vector<std::string> list_datasets(hid_t file, const std::string& group);
/// \brief A short numpy-like name of a dataset's element type: "float32", "uint8", "int64", ...
std::string type_name(hid_t type);

// --- Attributes ----------------------------------------------------------------------------

/// \brief Writes (or replaces) an attribute: int64, float64 or a variable-length UTF-8 string
/// (h5py reads it as str). In a parallel file every rank must call it with the same value.
void write_attr(hid_t obj, const std::string& name, const Attr& value);
/// \brief Writes (or replaces) a float32 attribute.
void write_float_attr(hid_t obj, const std::string& name, float value);
/// \brief Reads a scalar attribute of any integer, float or string (fixed or variable) type.
/// Integers come back as int64, floats as double. Other types throw std::runtime_error.
Attr read_attr(hid_t obj, const std::string& name);
/// \brief Reads an attribute if it exists.
std::optional<Attr> find_attr(hid_t obj, const std::string& name);
/// \brief Every scalar attribute of obj by name.
std::map<std::string, Attr> read_attrs(hid_t obj);

}  // namespace tessera::io::h5
