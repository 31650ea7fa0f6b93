#pragma once
// nn::Halo over the Communicator's spatial group (comm/halo_exchange.hpp): what a model split
// into blocks of rows (parallel.spatial) uses to exchange halos and sum its loss's per-sample
// norms.
#include <cstddef>

#include "comm/communicator.hpp"
#include "comm/halo_exchange.hpp"
#include "nn/halo.hpp"

namespace tessera {

template <class T>
class SpatialHalo final : public nn::Halo<T> {
 public:
  /// \brief Over comm's spatial group; comm must outlive this.
  explicit SpatialHalo(const Communicator& comm) : comm_(comm), exchange_(comm, Group::spatial) {}

  int rank() const override { return exchange_.rank(); }
  int size() const override { return exchange_.size(); }
  void start(const T* to_up, const T* to_down, T* from_up, T* from_down, std::size_t n) override {
    exchange_.start(to_up, to_down, from_up, from_down, n);
  }
  void finish() override { exchange_.finish(); }
  void sum(double* values, std::size_t n) override { comm_.allreduce_sum(values, n, Group::spatial); }
  nn::HaloStats stats() const override {
    return {exchange_.exchanges(), exchange_.bytes_sent(), exchange_.wait_seconds()};
  }

 private:
  const Communicator& comm_;
  HaloExchange exchange_;
};

}  // namespace tessera
