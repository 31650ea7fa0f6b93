#pragma once
// Small text files of a run (`checkpoints/latest`, `summary.json`): written whole through a
// temporary file that is synced and renamed into place, so a reader sees the old content or the
// new, never a part; read back with a size cap. No HDF5 here.
#include <cstddef>
#include <optional>
#include <string>

namespace tessera::io {

/// \brief Writes content to path + ".tmp", fsyncs it, renames it to path and fsyncs the
/// directory. Every failure (no space, a directory in the way, no permission) is an InputError
/// naming the path and the system's reason; path keeps its old content then.
void write_file_atomically(const std::string& path, const std::string& content);

/// \brief The content of a regular file of at most max_bytes, or nullopt with *why set to the
/// reason it cannot be read ("missing", "a directory", "larger than N bytes", the system's error).
std::optional<std::string> read_small_file(const std::string& path, std::size_t max_bytes,
                                           std::string* why);

}  // namespace tessera::io
