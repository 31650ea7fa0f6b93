#include "io/tensor_file_writer.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <bit>
#include <csignal>
#include <cerrno>
#include <cstring>

#include <fmt/format.h>

#include "io/tensor_check.hpp"

namespace tessera::io {

static_assert(std::endian::native == std::endian::little,
              "checkpoint datasets are float32 little-endian; a big-endian host would swap bytes here");

TensorFileWriter::TensorFileWriter(std::string path, std::vector<TensorSlab> slabs,
                                   std::vector<std::uint64_t> offsets, bool kill_halfway)
    : path_(std::move(path)), slabs_(std::move(slabs)), offsets_(std::move(offsets)), kill_halfway_(kill_halfway) {
  thread_ = std::thread([this] { run(); });
}

TensorFileWriter::~TensorFileWriter() {
  if (thread_.joinable()) thread_.join();
}

std::string TensorFileWriter::wait() {
  if (thread_.joinable()) thread_.join();
  return error_;
}

void TensorFileWriter::run() {
  const int fd = ::open(path_.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0) {
    error_ = fmt::format("{}: cannot open it to write the tensors: {}", path_, std::strerror(errno));
  } else {
    for (std::size_t i = 0; i < slabs_.size() && error_.empty(); ++i) {
      if (kill_halfway_ && i == slabs_.size() / 2) std::raise(SIGKILL);
      for_each_run(slabs_[i], [&](std::uint64_t index, const float* values, std::uint64_t n) {
        const char* bytes = reinterpret_cast<const char*>(values);
        std::uint64_t left = n * sizeof(float), at = offsets_[i] + index * sizeof(float);
        while (left > 0 && error_.empty()) {
          const ssize_t wrote = ::pwrite(fd, bytes, left, static_cast<off_t>(at));
          if (wrote < 0 && errno == EINTR) continue;
          if (wrote <= 0)
            error_ = fmt::format("{}: cannot write tensor {}: {}", path_, slabs_[i].path,
                                 wrote < 0 ? std::strerror(errno) : "no progress");
          else {
            bytes += wrote;
            at += static_cast<std::uint64_t>(wrote);
            left -= static_cast<std::uint64_t>(wrote);
          }
        }
      });
    }
    if (error_.empty() && ::fsync(fd) != 0)
      error_ = fmt::format("{}: cannot sync it: {}", path_, std::strerror(errno));
    ::close(fd);
  }
  done_.store(true, std::memory_order_release);
}

}  // namespace tessera::io
