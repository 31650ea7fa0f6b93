#pragma once
// Per-phase wall-clock accounting for the training step: data, forward, backward, allreduce,
// optimizer, tensor, pipeline. Each phase is also a Kokkos profiling region.
#include <array>
#include <chrono>
#include <cstddef>
#include <string>

#include "kernels/views.hpp"

namespace tessera {

/// allreduce: the data-parallel exchange (and ZeRO's gathers); tensor: sums over the tensor
/// group inside forward and backward; pipeline: waiting for a neighbouring stage (the bubble).
enum class Phase : std::size_t { data, forward, backward, allreduce, optimizer, tensor, pipeline, count };

class StepTimer {
 public:
  /// Times one phase: fences `exec` at the end so device work is counted where it belongs.
  class Scope {
   public:
    Scope(StepTimer& t, Phase p, const ExecSpace& exec)
        : t_(t), p_(p), exec_(exec), region_(name(p)), start_(now()) {}
    ~Scope() {
      exec_.fence();
      t_.seconds_[static_cast<std::size_t>(p_)] += now() - start_;
    }
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    StepTimer& t_;
    Phase p_;
    const ExecSpace& exec_;
    ScopedRegion region_;
    double start_;
  };

  Scope time(Phase p, const ExecSpace& exec) { return Scope(*this, p, exec); }
  double seconds(Phase p) const { return seconds_[static_cast<std::size_t>(p)]; }
  void reset() { seconds_.fill(0.0); }
  /// Counts s seconds of phase `from` as phase `to` (communication done inside compute phases).
  void move(Phase from, Phase to, double s) {
    seconds_[static_cast<std::size_t>(from)] -= s;
    seconds_[static_cast<std::size_t>(to)] += s;
  }
  /// Adds s seconds to phase p (timed elsewhere).
  void add(Phase p, double s) { seconds_[static_cast<std::size_t>(p)] += s; }

  static double now() {
    using namespace std::chrono;
    return duration<double>(steady_clock::now().time_since_epoch()).count();
  }
  static std::string name(Phase p) {
    static const char* names[] = {"data", "forward", "backward", "allreduce", "optimizer", "tensor", "pipeline"};
    return std::string("tessera::step::") + names[static_cast<std::size_t>(p)];
  }

 private:
  std::array<double, static_cast<std::size_t>(Phase::count)> seconds_{};
};

}  // namespace tessera
