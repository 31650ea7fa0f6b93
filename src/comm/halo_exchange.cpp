#include "comm/halo_exchange.hpp"

#include <chrono>
#include <stdexcept>

namespace tessera {

HaloExchange::HaloExchange(const Communicator& comm, Group g)
    : comm_(comm), group_(g), rank_(comm.rank(g)), size_(comm.size(g)) {}

HaloExchange::~HaloExchange() = default;  // PendingOp's destructor waits for what is in flight

template <class T>
void HaloExchange::start(const T* to_up, const T* to_down, T* from_up, T* from_down, std::size_t n) {
  if (!ops_.empty()) throw std::logic_error("tessera::HaloExchange::start with an exchange in flight");
  if (n == 0 || size_ == 1) return;
  // Post receives, then send.
  if (has_up()) ops_.push_back(comm_.irecv(from_up, n, rank_ - 1, kDown, group_));
  if (has_down()) ops_.push_back(comm_.irecv(from_down, n, rank_ + 1, kUp, group_));
  if (has_up()) ops_.push_back(comm_.isend(to_up, n, rank_ - 1, kUp, group_));
  if (has_down()) ops_.push_back(comm_.isend(to_down, n, rank_ + 1, kDown, group_));
  ++exchanges_;
  bytes_sent_ += n * sizeof(T) * ((has_up() ? 1u : 0u) + (has_down() ? 1u : 0u));
}

void HaloExchange::finish() {
  if (ops_.empty()) return;
  const auto t0 = std::chrono::steady_clock::now();
  for (auto& op : ops_) op.wait();
  ops_.clear();
  wait_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

template void HaloExchange::start<float>(const float*, const float*, float*, float*, std::size_t);
template void HaloExchange::start<double>(const double*, const double*, double*, double*, std::size_t);

}  // namespace tessera
