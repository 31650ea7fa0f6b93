#pragma once
// The point-to-point messages of a transformer's ring attention and window halo (nn/context_ring.cpp)
// within a context group (Group::spatial), behind nn::Gpt::Part's messages() and wait(), and what
// they cost: messages started, bytes sent, seconds blocked waiting for them (summary.json's
// "context", as the U-Net's halo reports its own).
#include <memory>
#include <span>
#include <vector>

#include "comm/communicator.hpp"
#include "nn/gpt.hpp"
#include "nn/halo.hpp"
#include "train/step_timer.hpp"

namespace tessera {

class ContextLink {
 public:
  /// \brief Over comm's spatial group; comm must outlive this.
  explicit ContextLink(const Communicator& comm) : comm_(comm) {}

  /// Starts every message (matched in posting order: one tag).
  void start(std::span<const nn::ContextMessage<float>> messages) {
    for (const auto& m : messages) {
      if (m.send) {
        pending_.push_back(comm_.isend(m.data, m.n, m.peer, kTag, Group::spatial));
        stats_.bytes_sent += m.n * sizeof(float);
        ++stats_.exchanges;
      } else {
        pending_.push_back(comm_.irecv(m.data, m.n, m.peer, kTag, Group::spatial));
      }
    }
  }
  /// Completes every message started.
  void wait() {
    const double t0 = StepTimer::now();
    for (auto& op : pending_) op.wait();
    pending_.clear();
    stats_.wait_seconds += StepTimer::now() - t0;
  }
  /// exchanges: messages sent.
  nn::HaloStats stats() const { return stats_; }

 private:
  static constexpr int kTag = 1 << 21;
  const Communicator& comm_;
  std::vector<PendingOp> pending_;
  nn::HaloStats stats_;
};

}  // namespace tessera
