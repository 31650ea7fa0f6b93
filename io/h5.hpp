#pragma once
// The thin layer over the HDF5 C API that the rest of io/ is written in: a check macro that
// records file and line, RAII handles for every kind of hid_t, attribute helpers and file openers.
// Only io/*.cpp include this header; nothing outside io/ sees hdf5.h.
#include <hdf5.h>
#include <mpi.h>

#include <cstdint>
#include <exception>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "io/attr.hpp"

namespace tessera::io::h5 {

/// \brief Throws for a failed HDF5 call: InputError naming the user's file and object while an
/// InputScope is alive on this thread (HDF5's own reason in parentheses), else std::runtime_error
/// naming expr, file and line (a bug). Either carries HDF5's innermost error message.
[[noreturn]] void fail(const char* expr, const char* file, int line);

/// \brief HDF5's description of its current error stack (the API-level message and, in
/// parentheses, the innermost one), which it then clears.
std::string error_text();

/// \brief Throws what fail() throws, for a problem the io layer found itself (an attribute that
/// is not a scalar, a link that dangles): InputError inside an InputScope, else runtime_error.
[[noreturn]] void fail_with(const std::string& what);

/// \brief While alive, failures of HDF5 calls on this thread concern a file the user gave or owns
/// (a dataset, a checkpoint, a run's output): fail() throws InputError, one line naming the file,
/// the innermost object named by a nested scope and whether it was being read or written. A
/// damaged, truncated or unwritable file is bad input (exit 2), never an internal error. Scopes nest.
class InputScope {
 public:
  enum class Access { read, write };
  /// \param file the path as the user gave it
  /// \param object what is being read inside it ("dataset /train/inputs"), or "" for the file
  explicit InputScope(std::string file, std::string object = "", Access access = Access::read);
  ~InputScope();
  InputScope(const InputScope&) = delete;
  InputScope& operator=(const InputScope&) = delete;
};

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

/// \brief An open HDF5 file. Closing a file opened on a communicator of several ranks is
/// collective, so one that goes out of scope while an exception unwinds is left open, not
/// closed: if every rank is unwinding the same agreed error, HDF5 closes it when MPI finalizes;
/// if this rank alone failed, the job is aborted (src/cli/cli.cpp), and a collective close here
/// would wait for ranks that never come.
class File {
 public:
  File() = default;
  explicit File(hid_t id, bool collective = false)
      : id_(id), collective_(collective), exceptions_(std::uncaught_exceptions()) {}
  File(const File&) = delete;
  File& operator=(const File&) = delete;
  File(File&& other) noexcept
      : id_(std::exchange(other.id_, H5I_INVALID_HID)), collective_(other.collective_),
        exceptions_(std::uncaught_exceptions()) {}
  File& operator=(File&& other) noexcept {
    if (this != &other) {
      reset();
      id_ = std::exchange(other.id_, H5I_INVALID_HID);
      collective_ = other.collective_;
    }
    return *this;
  }
  ~File() { reset(); }

  hid_t get() const { return id_; }
  operator hid_t() const { return id_; }  // NOLINT: lets handles pass straight to H5* calls
  bool valid() const { return id_ >= 0; }
  /// \brief Closes now (collective for a parallel file); a failed close (lost data) throws.
  void close();

 private:
  void reset() noexcept;
  hid_t id_ = H5I_INVALID_HID;
  bool collective_ = false;
  int exceptions_ = 0;  ///< uncaught exceptions when this handle was made
};

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
/// \brief Transfer list for independent MPI-IO reads (H5FD_MPIO_INDEPENDENT): no collective
/// inside, so a read that fails on one rank leaves no other waiting.
PropList independent_transfer();

/// \brief Opens an existing file read-only with the MPI-IO driver.
/// Must be called on every rank of comm. Failure throws std::runtime_error; callers check
/// existence and format first (describe_unreadable()) to turn user mistakes into InputError.
File open_parallel(MPI_Comm comm, const std::string& path);
/// \brief Creates (truncates) a file with the MPI-IO driver. Must be called on every rank of comm.
/// Files Tessera writes use HDF5's 1.10 format (H5Pset_libver_bounds V110): every piece of
/// metadata carries a checksum, so damage is reported rather than read as garbage.
File create_parallel(MPI_Comm comm, const std::string& path);
/// \brief Opens an existing file read-only with the default (serial) driver.
File open_serial(const std::string& path);
/// \brief Creates (truncates) a file with the default (serial) driver, in the 1.10 format.
File create_serial(const std::string& path);
/// \brief Pins a file access list to HDF5's 1.10 format (checksummed metadata; files HDF5 1.10
/// and later read).
void use_checksummed_format(hid_t fapl);

/// \brief Why path cannot be opened as HDF5 ("path: no such file", "path: not an HDF5 file"), or
/// nullopt when it can. Local and cheap: no collective.
std::optional<std::string> describe_unreadable(const std::string& path);

// --- Objects -------------------------------------------------------------------------------

/// \brief True if the object at path (e.g. "model/layers.0.weight") exists, checking each link:
/// false where a link is missing or one before the last leads to something other than a group;
/// a link that exists but leads nowhere (a dangling soft link, an external link to a missing
/// file) fails (fail_with) naming it.
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
/// \brief The dataset's size in bytes (elements x element size); fails (fail_with) where that
/// would not fit in 63 bits.
std::uint64_t declared_bytes(hid_t dataset);
/// \brief Fails (fail_with, naming `name`) unless the dataset stores everything its shape
/// declares: a contiguous dataset all its bytes, a chunked one every chunk. A dataset whose
/// shape claims far more than the file holds (damage, or a file written half-way) is caught here
/// before anything is sized by its shape.
void check_storage(hid_t dataset, const std::string& name);
/// \brief Dataset paths under group, recursive, relative to the file root, sorted.
std::vector<std::string> list_datasets(hid_t file, const std::string& group);
/// \brief A short numpy-like name of a dataset's element type: "float32", "uint8", "int64", ...
std::string type_name(hid_t type);

/// \brief Whether type is IEEE 754 binary32 or binary64 (either byte order): HDF5 also describes
/// floats with their bits placed otherwise, which Tessera does not read.
bool is_ieee_float(hid_t type);

// --- Attributes ----------------------------------------------------------------------------

/// \brief Writes (or replaces) an attribute: int64, float64 or a variable-length UTF-8 string
/// (h5py reads it as str). In a parallel file every rank must call it with the same value.
void write_attr(hid_t obj, const std::string& name, const Attr& value);
/// \brief Writes (or replaces) a float32 attribute.
void write_float_attr(hid_t obj, const std::string& name, float value);
/// \brief Reads a scalar attribute of any integer, float or string (fixed or variable) type.
/// Integers come back as int64, floats as double. Other types throw std::runtime_error.
Attr read_attr(hid_t obj, const std::string& name);
/// \brief Writes (or replaces) a uint64 attribute (collective in a parallel file, as write_attr).
void write_u64_attr(hid_t obj, const std::string& name, std::uint64_t value);
/// \brief Reads a scalar uint64 attribute if it exists; one of another type fails (fail_with).
std::optional<std::uint64_t> find_u64_attr(hid_t obj, const std::string& name);
/// \brief Reads an attribute if it exists.
std::optional<Attr> find_attr(hid_t obj, const std::string& name);
/// \brief Every scalar attribute of obj by name.
std::map<std::string, Attr> read_attrs(hid_t obj);

}  // namespace tessera::io::h5
