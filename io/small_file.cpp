#include "io/small_file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
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

// Closes fd on every path out.
struct Fd {
  int fd;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

}  // namespace

void write_file_atomically(const std::string& path, const std::string& content) {
  const std::string tmp = path + ".tmp";
  {
    Fd f{::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644)};
    if (f.fd < 0) fail(tmp, "create it", errno);
    for (std::size_t done = 0; done < content.size();) {
      const ssize_t n = ::write(f.fd, content.data() + done, content.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) fail(tmp, "write it", n < 0 ? errno : EIO);
      done += static_cast<std::size_t>(n);
    }
    if (::fsync(f.fd) != 0) fail(tmp, "sync it", errno);
    const int fd = std::exchange(f.fd, -1);
    if (::close(fd) != 0) fail(tmp, "close it", errno);
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) fail(path, "rename the temporary file to it", errno);
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  const std::string dir = parent.empty() ? "." : parent.string();
  Fd d{::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC)};
  if (d.fd < 0 || ::fsync(d.fd) != 0) fail(dir, "sync the directory", errno);
}

std::optional<std::string> read_small_file(const std::string& path, std::size_t max_bytes,
                                           std::string* why) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    *why = errno == ENOENT ? "missing" : std::strerror(errno);
    return std::nullopt;
  }
  if (!S_ISREG(st.st_mode)) {
    *why = S_ISDIR(st.st_mode) ? "a directory" : "not a regular file";
    return std::nullopt;
  }
  if (static_cast<std::uint64_t>(st.st_size) > max_bytes) {
    *why = fmt::format("larger than {} bytes", max_bytes);
    return std::nullopt;
  }
  Fd f{::open(path.c_str(), O_RDONLY | O_CLOEXEC)};
  if (f.fd < 0) {
    *why = std::strerror(errno);
    return std::nullopt;
  }
  std::string content(max_bytes + 1, '\0');
  std::size_t got = 0;
  while (got < content.size()) {
    const ssize_t n = ::read(f.fd, content.data() + got, content.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      *why = std::strerror(errno);
      return std::nullopt;
    }
    if (n == 0) break;
    got += static_cast<std::size_t>(n);
  }
  if (got > max_bytes) {
    *why = fmt::format("larger than {} bytes", max_bytes);
    return std::nullopt;
  }
  content.resize(got);
  return content;
}

}  // namespace tessera::io
