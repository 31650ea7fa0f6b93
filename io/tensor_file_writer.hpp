#pragma once
// The background half of an asynchronous checkpoint (checkpoint.async): the values of this rank's
// slabs written with plain POSIX writes into a checkpoint file whose layout (metadata, datasets
// with their storage allocated) already exists, on a thread of its own. The thread calls neither
// MPI nor HDF5 (Debian's parallel HDF5 is not thread-safe, and MPI_THREAD_MULTIPLE is not needed),
// so training goes on while it writes.
#include <atomic>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "io/checkpoint_file.hpp"

namespace tessera::io {

class TensorFileWriter {
 public:
  /// \brief Starts writing: slab i's elements go to byte offsets[i] + 4 * (logical index) of the
  /// file at path (each dataset contiguous, float32 little-endian), then the file is fsynced.
  /// The slabs' data must stay valid and unchanged until wait() returns.
  /// kill_halfway (a test hook, TESSERA_TEST_KILL_IN_CHECKPOINT): the process raises SIGKILL once
  /// half of the slabs are written, as a node lost in the middle of the background write.
  TensorFileWriter(std::string path, std::vector<TensorSlab> slabs, std::vector<std::uint64_t> offsets,
                   bool kill_halfway = false);
  /// Waits for the thread.
  ~TensorFileWriter();
  TensorFileWriter(const TensorFileWriter&) = delete;
  TensorFileWriter& operator=(const TensorFileWriter&) = delete;

  /// \brief True once the thread has finished, written or failed. Local, never blocks.
  bool done() const { return done_.load(std::memory_order_acquire); }
  /// \brief Waits for the thread; "" when everything was written and synced, else why not (the
  /// path and the system's reason).
  std::string wait();

 private:
  void run();

  std::string path_;
  std::vector<TensorSlab> slabs_;
  std::vector<std::uint64_t> offsets_;
  bool kill_halfway_ = false;
  std::string error_;
  std::atomic<bool> done_{false};
  std::thread thread_;
};

}  // namespace tessera::io
