#pragma once
// A file written whole or not at all: bytes go to PATH.tmp, commit() syncs it and renames it to
// PATH; an OutputFile destroyed before commit() removes PATH.tmp, so a failure leaves nothing
// behind (and an older PATH untouched). For exports of any size; small text files have
// io/small_file.hpp. No HDF5 here.
#include <cstddef>
#include <cstdint>
#include <string>

namespace tessera::io {

class OutputFile {
 public:
  /// \brief Creates PATH.tmp; InputError naming it where it cannot be created.
  explicit OutputFile(std::string path);
  ~OutputFile();
  OutputFile(const OutputFile&) = delete;
  OutputFile& operator=(const OutputFile&) = delete;

  /// \brief Appends n bytes; InputError naming the file where the system refuses (a full disk).
  void write(const void* data, std::size_t n);
  void write(const std::string& bytes) { write(bytes.data(), bytes.size()); }
  /// Bytes written so far.
  std::uint64_t size() const { return size_; }
  /// \brief Syncs, closes and renames PATH.tmp to PATH, then syncs the directory.
  void commit();

 private:
  std::string path_, tmp_;
  int fd_ = -1;
  std::uint64_t size_ = 0;
};

}  // namespace tessera::io
