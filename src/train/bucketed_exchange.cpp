#include "train/bucketed_exchange.hpp"

#include "train/step_timer.hpp"

namespace tessera {

BucketedExchange::BucketedExchange(const Config& cfg, const Communicator& comm, nn::ParamStore<float>& store,
                                   Sharding& sharding, OptimizerStep& step)
    : comm_(comm),
      store_(store),
      sharding_(sharding),
      step_(step),
      overlap_(cfg.comm.overlap),
      no_sync_(cfg.comm.no_sync),
      // Our own point-to-point allreduce algorithms have no nonblocking form.
      blocking_allreduce_(comm.allreduce_algorithm() != AllreduceAlgorithm::mpi),
      buckets_(store.buckets().size()) {}

void BucketedExchange::begin_step(const ExecSpace& exec) {
  sharding_.begin_step(exec);
  forget_hook_comm_seconds();
}

void BucketedExchange::begin_backward(const ExecSpace& exec, int m, int count) {
  wait_all();
  // no_sync: gradients accumulate locally until the last micro-batch, where a full buffer holds them.
  sync_ = !no_sync_ || sharding_.grads_sharded() || m == count - 1;
  if (!no_sync_) sharding_.prepare_resync(exec, m == 0);
}

void BucketedExchange::end_backward(const ExecSpace& exec) {
  exec.fence();
  poll();
}

void BucketedExchange::before_forward(std::size_t unit) {
  const HookTimer timer(*this);
  sharding_.gather(exec_, store_.bucket_of_unit(unit));
}

void BucketedExchange::after_forward(std::size_t unit) {
  const HookTimer timer(*this);
  const std::size_t b = store_.bucket_of_unit(unit);
  if (unit == store_.buckets()[b].last_unit) sharding_.release(exec_, b);
  sharding_.progress();
}

void BucketedExchange::before_backward(std::size_t unit) {
  const HookTimer timer(*this);
  const std::size_t b = store_.bucket_of_unit(unit);
  sharding_.gather(exec_, b);
  if (sharding_.needs_grad_buffer(b)) {
    // Bound the gradient memory: at most one other bucket's exchange in flight while this one
    // fills (otherwise every bucket could be held until the end of the step).
    for (std::size_t other = 0; other < buckets_.size(); ++other)
      if (other != b && other != last_started_ && buckets_[other].exchanging) complete(other);
    sharding_.attach_grad_buffer(b);
  }
  poll();
}

void BucketedExchange::after_backward(std::size_t unit) {
  const HookTimer timer(*this);
  const std::size_t b = store_.bucket_of_unit(unit);
  if (unit == store_.buckets()[b].first_unit) {
    sharding_.release(exec_, b);
    bucket_ready(b);
  }
  poll();
}

void BucketedExchange::bucket_ready(std::size_t b) {
  if (!sync_) return;  // no-sync: accumulate locally until the last micro-batch
  exec_.fence();
  // Without overlap, or for the bucket holding the first layer (the last to fill, with nothing
  // left to hide it behind), the library's blocking (tuned) collective serves best.
  start_exchange(b, !overlap_ || store_.buckets()[b].first_unit == 0);
}

void BucketedExchange::start_exchange(std::size_t b, bool blocking) {
  const Sharding::Exchange e = sharding_.exchange(b);
  const Group g = sharding_.group();
  auto& s = buckets_[b];
  s.exchanging = true;
  s.across_pending = e.across_nodes;
  last_started_ = b;
  const ReduceDtype wire = comm_.reduce_dtype();  // comm.reduce_dtype: bf16 halves the bytes
  if (!e.scatter) {
    if (blocking || blocking_allreduce_) comm_.allreduce_sum(e.send, e.length, g, wire);
    else s.op = comm_.iallreduce_sum(e.send, e.length, g, wire);
  } else {
    if (blocking) comm_.reduce_scatter_sum(e.send, e.recv, e.chunk, g, wire);
    else s.op = comm_.ireduce_scatter_sum(e.send, e.recv, e.chunk, g, wire);
  }
  if (blocking || (!e.scatter && blocking_allreduce_)) complete(b);
}

void BucketedExchange::advance(std::size_t b, bool wait) {
  auto& s = buckets_[b];
  while (s.exchanging) {
    if (wait) s.op.wait();
    else if (!s.op.test()) return;
    if (s.across_pending) {
      // The node's sum of this rank's chunk is in; now the same chunk of every node's.
      s.across_pending = false;
      const Sharding::Exchange e = sharding_.exchange(b);
      s.op = comm_.iallreduce_sum(e.recv, e.chunk, Group::replica_cross, comm_.reduce_dtype());
      continue;
    }
    s.exchanging = false;
    sharding_.exchanged(exec_, b);
  }
}

void BucketedExchange::poll() {
  for (std::size_t b = 0; b < buckets_.size(); ++b) advance(b, false);
  sharding_.progress();
}

void BucketedExchange::wait_all() {
  for (std::size_t b = buckets_.size(); b-- > 0;)
    if (buckets_[b].exchanging) complete(b);
}

StepReport BucketedExchange::finish_step(const ExecSpace& exec, double lr, double grad_scale, bool skip_nonfinite) {
  const double t0 = StepTimer::now();
  end_backward(exec);
  wait_all();
  exec.fence();
  const double waited = StepTimer::now() - t0;
  StepReport report = step_.run(exec, lr, grad_scale, skip_nonfinite);
  report.comm_s += waited;
  return report;
}

}  // namespace tessera
