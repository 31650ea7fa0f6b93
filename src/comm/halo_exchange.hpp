#pragma once
// Halo exchange between the neighbours of a group whose ranks hold consecutive blocks of rows of
// a field (the spatial group): rank r's block follows rank r-1's ("up") and precedes rank r+1's
// ("down"). Nonblocking sends and receives through the Communicator (recorded by the flight
// recorder), so the caller computes what needs no halo while they travel. A message travelling
// down carries tag kDown, one travelling up kUp; each pair of neighbours has at most one exchange
// in flight, so messages match in order.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "comm/communicator.hpp"

namespace tessera {

class HaloExchange {
 public:
  static constexpr int kUp = 1 << 21, kDown = (1 << 21) + 1;

  /// \brief Exchanges within group g of comm (which must outlive this).
  explicit HaloExchange(const Communicator& comm, Group g = Group::spatial);
  HaloExchange(const HaloExchange&) = delete;
  HaloExchange& operator=(const HaloExchange&) = delete;
  ~HaloExchange();

  int rank() const { return rank_; }
  int size() const { return size_; }
  bool has_up() const { return rank_ > 0; }
  bool has_down() const { return rank_ + 1 < size_; }

  /// \brief Starts sending to_up (n values) to rank - 1 and to_down to rank + 1, and receiving n
  /// values from each into from_up and from_down; sides without a neighbour are skipped (their
  /// pointers may be null). Host memory, or device memory the MPI library takes. Buffers stay
  /// untouched until finish(), which must come before the next start().
  template <class T>
  void start(const T* to_up, const T* to_down, T* from_up, T* from_down, std::size_t n);
  /// \brief Waits for the exchange in flight (nothing when none is).
  void finish();

  /// Exchanges started with a neighbour, bytes sent, seconds blocked in finish(), since construction.
  std::uint64_t exchanges() const { return exchanges_; }
  std::uint64_t bytes_sent() const { return bytes_sent_; }
  double wait_seconds() const { return wait_seconds_; }

 private:
  const Communicator& comm_;
  Group group_;
  int rank_ = 0, size_ = 1;
  std::vector<PendingOp> ops_;
  std::uint64_t exchanges_ = 0, bytes_sent_ = 0;
  double wait_seconds_ = 0.0;
};

extern template void HaloExchange::start<float>(const float*, const float*, float*, float*, std::size_t);
extern template void HaloExchange::start<double>(const double*, const double*, double*, double*, std::size_t);

}  // namespace tessera
