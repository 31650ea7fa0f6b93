#pragma once
// What a model whose samples are split into blocks of rows (spatial parallelism) needs from its
// neighbours: the rows just beyond its block before a convolution (halos), the gradients of
// those rows back after it, and sums over the ranks sharing the samples (the loss's per-sample
// norms). The runtime implements it over the Communicator's spatial group (train/spatial_halo.hpp);
// nn/ stays free of MPI. "Up" is the rank holding the rows before this block (spatial rank - 1),
// "down" the one holding the rows after it.
#include <cstddef>
#include <cstdint>

namespace tessera::nn {

/// What a halo exchange moved and how long the model waited for it.
struct HaloStats {
  std::uint64_t exchanges = 0;   ///< start() calls with a neighbour
  std::uint64_t bytes_sent = 0;  ///< to both neighbours
  double wait_seconds = 0.0;     ///< blocked in finish()

  /// What happened between two snapshots, and the sum of such.
  HaloStats operator-(const HaloStats& o) const {
    return {exchanges - o.exchanges, bytes_sent - o.bytes_sent, wait_seconds - o.wait_seconds};
  }
  HaloStats& operator+=(const HaloStats& o) {
    exchanges += o.exchanges;
    bytes_sent += o.bytes_sent;
    wait_seconds += o.wait_seconds;
    return *this;
  }
};

template <class T>
class Halo {
 public:
  virtual ~Halo() = default;
  /// This rank's place among the ranks sharing each sample (its block is the rank-th of size).
  virtual int rank() const = 0;
  virtual int size() const = 0;
  bool has_up() const { return rank() > 0; }
  bool has_down() const { return rank() + 1 < size(); }

  /// \brief Starts sending to_up to the rank above and to_down to the rank below, and receiving
  /// n values from each into from_up and from_down; a side without a neighbour is skipped (its
  /// pointers may be null). Work writing to_up/to_down must be finished (fence first); the
  /// buffers stay untouched until finish(). At most one exchange is in flight.
  virtual void start(const T* to_up, const T* to_down, T* from_up, T* from_down, std::size_t n) = 0;
  /// \brief Waits until the exchange started last is complete (from_up/from_down written).
  virtual void finish() = 0;
  /// \brief Sums n values in place over the ranks sharing the samples (every one calls it).
  virtual void sum(double* values, std::size_t n) = 0;
  virtual HaloStats stats() const = 0;
};

}  // namespace tessera::nn
