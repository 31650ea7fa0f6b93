#pragma once
// optimizer.offload = "disk": the optimizer state of one rank in one scratch file on a node-local
// path, read and written in tiles. Scratch, never the source of truth: the file is unlinked as soon
// as it is open, so whatever ends the process (an exit, a signal, a killed node) leaves nothing to
// be trusted or cleaned up, and the checkpoint's HDF5 tensors stay the state a run resumes from.
// Its space is reserved when it is made, so a full disk fails the run before its first step.
//
// O_DIRECT where the file system takes it (the page cache would only hold a second copy of what
// the buffer holds), buffered I/O where it does not (tmpfs, overlay, some parallel file systems);
// describe() says which. Every read and write covers whole blocks of kBlock elements (4 KiB,
// O_DIRECT's alignment), and the host buffers are aligned to it.
#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <mutex>
#include <string>
#include <thread>

namespace tessera {

class StateFile {
 public:
  /// Elements per block: offsets and lengths of read() and write() are multiples of it (a length
  /// may end at the padded end of a state).
  static constexpr std::size_t kBlock = 1024;

  /// \brief A file under `dir` holding `states` arrays of `n` floats (each padded to whole
  /// blocks), for world rank `rank`, named tessera-optimizer-<what>.<pid>.rank<rank>. InputError
  /// naming the path where the directory is missing or refuses a file, or the space cannot be
  /// reserved.
  StateFile(const std::string& dir, int rank, std::size_t states, std::size_t n, const std::string& what = "state");
  ~StateFile();
  StateFile(const StateFile&) = delete;
  StateFile& operator=(const StateFile&) = delete;

  /// Elements of one state as stored: n rounded up to whole blocks.
  std::size_t padded() const { return padded_; }
  /// \brief Reads `count` elements of state `s` from element `begin` into `out` (aligned to 4 KiB
  /// where direct()). InputError naming the path and the rank on an I/O error.
  void read(std::size_t s, std::size_t begin, std::size_t count, float* out) const;
  /// \brief Writes them back. InputError naming the path and the rank on an I/O error (a full disk,
  /// EIO).
  void write(std::size_t s, std::size_t begin, std::size_t count, const float* in);
  /// \brief Reads `n` elements of state `s` from element `at` (any range) into `out`, whole blocks
  /// at a time through `buffer` (`capacity` floats: whole blocks, aligned as read() needs).
  void read_range(std::size_t s, std::size_t at, std::size_t n, float* out, float* buffer, std::size_t capacity) const;
  /// \brief Writes them from `in` the same way; a window that starts or ends inside a block keeps
  /// the block's other elements.
  void write_range(std::size_t s, std::size_t at, std::size_t n, const float* in, float* buffer, std::size_t capacity);

  bool direct() const { return direct_; }
  /// "<path> (O_DIRECT)" or "<path> (buffered I/O: <why>)", for the run log; the path is the one
  /// the file had before it was unlinked.
  std::string describe() const;
  /// Bytes read and written since the file was made.
  double bytes_read() const { return read_bytes_; }
  double bytes_written() const { return written_bytes_; }

 private:
  std::string path_;
  std::string why_buffered_;
  int fd_ = -1;
  int rank_ = 0;
  bool direct_ = false;
  std::size_t padded_ = 0;
  mutable double read_bytes_ = 0.0;
  double written_bytes_ = 0.0;
  long writes_ = 0;  // writes made (the test hook counts them)
  mutable std::atomic<long> reads_{0};  // reads made (the same; from the I/O thread or a gather)
};

/// \brief The directory optimizer.offload_path names: the path itself, else $TMPDIR, else /tmp.
std::string offload_dir(const std::string& offload_path);

}  // namespace tessera

namespace tessera {

/// \brief One background thread doing a StateFile's reads and writes in the order they were
/// queued, so that the optimizer reads the next tile and writes the last one while it updates
/// this one. A request that fails stops the queue: every later one is dropped, and wait() on it or
/// anything after rethrows the error (an InputError naming the file and the rank).
class StateIo {
 public:
  explicit StateIo(StateFile& file);
  ~StateIo();
  StateIo(const StateIo&) = delete;
  StateIo& operator=(const StateIo&) = delete;

  /// Queue a read (or write) of whole blocks, as StateFile::read (write); returns its ticket.
  std::uint64_t read(std::size_t s, std::size_t begin, std::size_t count, float* out);
  std::uint64_t write(std::size_t s, std::size_t begin, std::size_t count, const float* in);
  /// Queue StateFile::read_range of any `n` elements from `at`, through `buffer` (`capacity`
  /// floats, which the request uses until it is done); returns its ticket.
  std::uint64_t read_range(std::size_t s, std::size_t at, std::size_t n, float* out, float* buffer,
                           std::size_t capacity);
  /// \brief Waits for the request `ticket` and every one before it; rethrows a failure.
  void wait(std::uint64_t ticket);

 private:
  struct Request;
  void run();
  std::uint64_t queue(Request r);

  StateFile& file_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<Request> requests_;
  std::uint64_t queued_ = 0, done_ = 0;
  std::exception_ptr error_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace tessera
