#include "optim/state_file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstring>

#include <fmt/format.h>

#include "core/error.hpp"
#include "core/test_hooks.hpp"

namespace tessera {

namespace {
constexpr std::size_t kBlockBytes = StateFile::kBlock * sizeof(float);
}  // namespace

std::string offload_dir(const std::string& offload_path) {
  if (!offload_path.empty()) return offload_path;
  const char* tmp = std::getenv("TMPDIR");
  return tmp != nullptr && *tmp != '\0' ? std::string(tmp) : std::string("/tmp");
}

StateFile::StateFile(const std::string& dir, int rank, std::size_t states, std::size_t n, const std::string& what)
    : rank_(rank), padded_((n + kBlock - 1) / kBlock * kBlock) {
  path_ = fmt::format("{}/tessera-optimizer-{}.{}.rank{}", dir, what, ::getpid(), rank);
  const int flags = O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC;
  fd_ = ::open(path_.c_str(), flags | O_DIRECT, 0600);
  if (fd_ >= 0) {
    direct_ = true;
  } else if (errno == EINVAL) {
    why_buffered_ = "the file system refuses O_DIRECT";
    fd_ = ::open(path_.c_str(), flags, 0600);
  }
  if (fd_ < 0)
    throw InputError(fmt::format("optimizer.offload_path: cannot create {} on rank {}: {}", path_, rank,
                                 std::strerror(errno)));
  // Scratch: gone from the directory at once, gone from the disk when the process ends.
  ::unlink(path_.c_str());
  const auto bytes = static_cast<off_t>(states * padded_ * sizeof(float));
  if (bytes > 0) {
    const int err = ::posix_fallocate(fd_, 0, bytes);
    if (err != 0)
      throw InputError(fmt::format("optimizer.offload_path: cannot reserve {:.1f} MB for {} on rank {}: {}",
                                   static_cast<double>(bytes) / 1e6, path_, rank, std::strerror(err)));
  }
}

StateFile::~StateFile() {
  if (fd_ >= 0) ::close(fd_);
}

void StateFile::read(std::size_t s, std::size_t begin, std::size_t count, float* out) const {
  // Test hook (core/test_hooks.hpp): world rank 1's K-th read fails as a failing disk's would.
  const long reads = ++reads_;
  if (rank_ == 1 && test_hooks::fail_offload_read() == reads)
    throw InputError(fmt::format("optimizer.offload: reading {} on rank {} failed: {} (TESSERA_TEST_FAIL_OFFLOAD_READ)",
                                 path_, rank_, std::strerror(EIO)));
  auto* p = reinterpret_cast<char*>(out);
  std::size_t left = count * sizeof(float);
  auto at = static_cast<off_t>((s * padded_ + begin) * sizeof(float));
  while (left > 0) {
    const ssize_t got = ::pread(fd_, p, left, at);
    if (got <= 0)
      throw InputError(fmt::format("optimizer.offload: reading {} on rank {} failed: {}", path_, rank_,
                                   got == 0 ? "unexpected end of file" : std::strerror(errno)));
    p += got;
    at += got;
    left -= static_cast<std::size_t>(got);
  }
  read_bytes_ += static_cast<double>(count * sizeof(float));
}

void StateFile::write(std::size_t s, std::size_t begin, std::size_t count, const float* in) {
  // Test hooks (core/test_hooks.hpp): world rank 1's K-th write fails as a failing disk's would,
  // or the rank dies there, mid-update.
  ++writes_;
  if (rank_ == 1 && test_hooks::kill_in_offload_write() == writes_) ::raise(SIGKILL);
  if (rank_ == 1 && test_hooks::fail_offload_write() == writes_)
    throw InputError(fmt::format("optimizer.offload: writing {} on rank {} failed: {} (TESSERA_TEST_FAIL_OFFLOAD_WRITE)",
                                 path_, rank_, std::strerror(EIO)));
  const auto* p = reinterpret_cast<const char*>(in);
  std::size_t left = count * sizeof(float);
  auto at = static_cast<off_t>((s * padded_ + begin) * sizeof(float));
  while (left > 0) {
    const ssize_t put = ::pwrite(fd_, p, left, at);
    if (put <= 0)
      throw InputError(fmt::format("optimizer.offload: writing {} on rank {} failed: {}", path_, rank_,
                                   put == 0 ? "nothing written" : std::strerror(errno)));
    p += put;
    at += put;
    left -= static_cast<std::size_t>(put);
  }
  written_bytes_ += static_cast<double>(count * sizeof(float));
}

void StateFile::read_range(std::size_t s, std::size_t at, std::size_t n, float* out, float* buffer,
                           std::size_t capacity) const {
  for (std::size_t e = at; e < at + n;) {
    const std::size_t first = e / kBlock * kBlock, stop = std::min(at + n, first + capacity);
    const std::size_t last = std::min((stop + kBlock - 1) / kBlock * kBlock, padded_);
    read(s, first, last - first, buffer);
    std::copy_n(buffer + (e - first), stop - e, out + (e - at));
    e = stop;
  }
}

void StateFile::write_range(std::size_t s, std::size_t at, std::size_t n, const float* in, float* buffer,
                            std::size_t capacity) {
  for (std::size_t e = at; e < at + n;) {
    const std::size_t first = e / kBlock * kBlock, stop = std::min(at + n, first + capacity);
    const std::size_t last = std::min((stop + kBlock - 1) / kBlock * kBlock, padded_);
    if (e != first || stop != last) read(s, first, last - first, buffer);
    std::copy_n(in + (e - at), stop - e, buffer + (e - first));
    write(s, first, last - first, buffer);
    e = stop;
  }
}

std::string StateFile::describe() const {
  return direct_ ? fmt::format("{} (O_DIRECT)", path_) : fmt::format("{} (buffered I/O: {})", path_, why_buffered_);
}

static_assert(kBlockBytes == 4096, "O_DIRECT's alignment");

}  // namespace tessera

namespace tessera {

struct StateIo::Request {
  bool write = false;
  std::size_t s = 0, begin = 0, count = 0;
  float* data = nullptr;
  float* buffer = nullptr;  // a ranged read's bounce buffer (nullptr: whole blocks into data)
  std::size_t capacity = 0;
};

StateIo::StateIo(StateFile& file) : file_(file), thread_([this] { run(); }) {}

StateIo::~StateIo() {
  {
    const std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  changed_.notify_all();
  thread_.join();
}

std::uint64_t StateIo::queue(Request r) {
  std::uint64_t ticket = 0;
  {
    const std::lock_guard<std::mutex> lock(mutex_);
    requests_.push_back(r);
    ticket = ++queued_;
  }
  changed_.notify_all();
  return ticket;
}

std::uint64_t StateIo::read(std::size_t s, std::size_t begin, std::size_t count, float* out) {
  return queue({false, s, begin, count, out});
}

std::uint64_t StateIo::write(std::size_t s, std::size_t begin, std::size_t count, const float* in) {
  return queue({true, s, begin, count, const_cast<float*>(in)});
}

std::uint64_t StateIo::read_range(std::size_t s, std::size_t at, std::size_t n, float* out, float* buffer,
                                  std::size_t capacity) {
  return queue({false, s, at, n, out, buffer, capacity});
}

void StateIo::wait(std::uint64_t ticket) {
  std::unique_lock<std::mutex> lock(mutex_);
  changed_.wait(lock, [&] { return done_ >= ticket; });
  if (error_) std::rethrow_exception(error_);
}

void StateIo::run() {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    changed_.wait(lock, [&] { return stopping_ || !requests_.empty(); });
    if (requests_.empty()) return;  // stopping, nothing left
    const Request r = requests_.front();
    requests_.pop_front();
    const bool failed = error_ != nullptr;
    lock.unlock();
    std::exception_ptr error;
    if (!failed) {  // after a failure, drop the rest
      try {
        if (r.write) file_.write(r.s, r.begin, r.count, r.data);
        else if (r.buffer != nullptr) file_.read_range(r.s, r.begin, r.count, r.data, r.buffer, r.capacity);
        else file_.read(r.s, r.begin, r.count, r.data);
      } catch (...) {
        error = std::current_exception();
      }
    }
    lock.lock();
    if (error && !error_) error_ = error;
    ++done_;
    changed_.notify_all();
  }
}

}  // namespace tessera
