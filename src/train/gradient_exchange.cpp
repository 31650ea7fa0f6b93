#include "train/gradient_exchange.hpp"

#include "train/bucketed_exchange.hpp"
#include "train/priority_exchange.hpp"
#include "train/step_timer.hpp"

namespace tessera {

std::unique_ptr<GradientExchange> GradientExchange::make(const Config& cfg, const Communicator& comm,
                                                         nn::ParamStore<float>& store, Sharding& sharding,
                                                         OptimizerStep& step) {
  if (cfg.comm.priority) return std::make_unique<PriorityExchange>(cfg, comm, store, sharding, step);
  return std::make_unique<BucketedExchange>(cfg, comm, store, sharding, step);
}

GradientExchange::HookTimer::HookTimer(GradientExchange& owner)
    : total_(owner.hook_comm_s_), start_(StepTimer::now()) {}

GradientExchange::HookTimer::~HookTimer() { total_ += StepTimer::now() - start_; }

}  // namespace tessera
