#include "io/output_file.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <utility>

#include <fmt/format.h>

#include "core/error.hpp"

namespace tessera::io {

namespace {

[[noreturn]] void fail(const std::string& path, const char* what, int err) {
  throw InputError(fmt::format("{}: cannot {}: {}", path, what, std::strerror(err)));
}

}  // namespace

OutputFile::OutputFile(std::string path) : path_(std::move(path)), tmp_(path_ + ".tmp") {
  fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) fail(tmp_, "create it", errno);
}

OutputFile::~OutputFile() {
  if (fd_ < 0) return;
  ::close(fd_);
  ::unlink(tmp_.c_str());
}

void OutputFile::write(const void* data, std::size_t n) {
  const auto* bytes = static_cast<const char*>(data);
  for (std::size_t done = 0; done < n;) {
    const ssize_t k = ::write(fd_, bytes + done, n - done);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) fail(tmp_, "write it", k < 0 ? errno : EIO);
    done += static_cast<std::size_t>(k);
  }
  size_ += n;
}

void OutputFile::commit() {
  if (::fsync(fd_) != 0) fail(tmp_, "sync it", errno);
  const int fd = std::exchange(fd_, -1);
  if (::close(fd) != 0) {
    const int err = errno;
    ::unlink(tmp_.c_str());
    fail(tmp_, "close it", err);
  }
  if (::rename(tmp_.c_str(), path_.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp_.c_str());
    fail(path_, "rename the temporary file to it", err);
  }
  const std::filesystem::path parent = std::filesystem::path(path_).parent_path();
  const std::string dir = parent.empty() ? "." : parent.string();
  const int d = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  const bool synced = d >= 0 && ::fsync(d) == 0;
  const int err = errno;
  if (d >= 0) ::close(d);
  if (!synced) fail(dir, "sync the directory", err);
}

}  // namespace tessera::io
