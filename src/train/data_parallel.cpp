#include "train/data_parallel.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "core/memory.hpp"
#include "kernels/reduce.hpp"
#include "train/step_timer.hpp"

namespace tessera {

struct DataParallel::BucketState {
  PendingOp op;
  bool exchanging = false;     // an exchange was started and its completion not yet handled
  bool across_pending = false; // hybrid sharding: the sum across nodes follows the one in the node
};

namespace {
// Adds the lifetime of a hook to a total: what hooks do is communication (gathers, starting,
// testing and completing exchanges), which the step's timing counts as such.
class HookTimer {
 public:
  explicit HookTimer(double& total) : total_(total), start_(StepTimer::now()) {}
  ~HookTimer() { total_ += StepTimer::now() - start_; }
  HookTimer(const HookTimer&) = delete;
  HookTimer& operator=(const HookTimer&) = delete;

 private:
  double& total_;
  double start_;
};

// y += x, element-wise.
void accumulate(const ExecSpace& exec, VectorU<float> y, VectorU<float> x) {
  Kokkos::parallel_for("tessera::DataParallel::accumulate", range(exec, Index(y.size())),
                       KOKKOS_LAMBDA(const Index i) { y(i) += x(i); });
}
}  // namespace

DataParallel::DataParallel(const Config& cfg, const Communicator& comm, nn::ParamStore<float>& store,
                           Sharding& sharding)
    : cfg_(cfg),
      comm_(comm),
      store_(store),
      sharding_(sharding),
      opt_(cfg.optimizer, sharding.state_size()),
      overlap_(cfg.comm.overlap),
      no_sync_(cfg.comm.no_sync),
      // Our own point-to-point allreduce algorithms have no nonblocking form.
      blocking_allreduce_(comm.allreduce_algorithm() != AllreduceAlgorithm::mpi),
      buckets_(store.buckets().size()) {}

DataParallel::~DataParallel() = default;

void DataParallel::begin_step(const ExecSpace& exec) {
  sharding_.begin_step(exec);
  hook_comm_s_ = 0.0;  // what evaluation's forwards spent belongs to no step
}

void DataParallel::begin_backward(const ExecSpace& exec, int m, int count) {
  wait_all();
  // no_sync: gradients accumulate locally until the last micro-batch, where a full buffer holds them.
  sync_ = !no_sync_ || sharding_.grads_sharded() || m == count - 1;
  if (!no_sync_) sharding_.prepare_resync(exec, m == 0);
}

void DataParallel::end_backward(const ExecSpace& exec) {
  exec.fence();
  poll();
}

void DataParallel::before_forward(std::size_t unit) {
  const HookTimer timer(hook_comm_s_);
  sharding_.gather(exec_, store_.bucket_of_unit(unit));
}

void DataParallel::after_forward(std::size_t unit) {
  const HookTimer timer(hook_comm_s_);
  const std::size_t b = store_.bucket_of_unit(unit);
  if (unit == store_.buckets()[b].last_unit) sharding_.release(exec_, b);
}

void DataParallel::before_backward(std::size_t unit) {
  const HookTimer timer(hook_comm_s_);
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

void DataParallel::after_backward(std::size_t unit) {
  const HookTimer timer(hook_comm_s_);
  const std::size_t b = store_.bucket_of_unit(unit);
  if (unit == store_.buckets()[b].first_unit) {
    sharding_.release(exec_, b);
    bucket_ready(b);
  }
  poll();
}

void DataParallel::sum_tied_gradients(const ExecSpace& exec) {
  const int stages = comm_.size(Group::pipeline);
  for (const auto& info : store_.infos()) {
    if (info.tie == nn::Tie::none || stages == 1) continue;
    // The tied parameter is alone in its bucket on both stages, so the two buckets (and their
    // shards) are laid out alike: sum them element by element. a + b on one side and b + a on
    // the other give the same bits.
    const VectorU<float> g = sharding_.reduced(info.bucket);
    const std::size_t n = g.size();
    if (tied_recv_.extent(0) < n)
      tied_recv_ = Vector<float>(mem::label(mem::Category::comm, "tessera::DataParallel::tied"), n);
    const int partner = info.tie == nn::Tie::original ? stages - 1 : 0;
    const int tag = (1 << 20) + 1;
    PendingOp send = comm_.isend(g.data(), n, partner, tag, Group::pipeline);
    comm_.recv(tied_recv_.data(), n, partner, tag, Group::pipeline);
    send.wait();
    accumulate(exec, g, VectorU<float>(tied_recv_.data(), n));
    exec.fence();
  }
}

void DataParallel::bucket_ready(std::size_t b) {
  if (!sync_) return;  // no-sync: accumulate locally until the last micro-batch
  exec_.fence();
  // Without overlap, or for the bucket holding the first layer (the last to fill, with nothing
  // left to hide it behind), the library's blocking (tuned) collective serves best.
  start_exchange(b, !overlap_ || store_.buckets()[b].first_unit == 0);
}

void DataParallel::start_exchange(std::size_t b, bool blocking) {
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

void DataParallel::advance(std::size_t b, bool wait) {
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

void DataParallel::complete(std::size_t b) { advance(b, true); }

void DataParallel::poll() {
  for (std::size_t b = 0; b < buckets_.size(); ++b) advance(b, false);
}

void DataParallel::wait_all() {
  for (std::size_t b = buckets_.size(); b-- > 0;)
    if (buckets_[b].exchanging) complete(b);
}

double DataParallel::take_hook_comm_seconds() {
  const double s = hook_comm_s_;
  hook_comm_s_ = 0.0;
  return s;
}

double DataParallel::finish_step(const ExecSpace& exec, double lr, double grad_scale, bool skip_nonfinite) {
  const double t0 = StepTimer::now();
  end_backward(exec);
  wait_all();
  exec.fence();
  sum_tied_gradients(exec);
  const double t1 = StepTimer::now();

  // The global gradient norm: the sum of squares of every parameter's logical gradient once. The
  // sharding adds up what the replica group holds; tensor blocks and pipeline stages add up over
  // their groups.
  double squares = sharding_.grad_squares(exec, comm_.rank(Group::tensor) == 0);
  if (comm_.size(Group::tensor) > 1) comm_.allreduce_sum(&squares, 1, Group::tensor);
  if (comm_.size(Group::pipeline) > 1) comm_.allreduce_sum(&squares, 1, Group::pipeline);
  const double norm = std::sqrt(squares) / grad_scale;
  skipped_ = skip_nonfinite && !std::isfinite(norm);
  if (skipped_) {  // an overflow: leave parameters and optimizer state as they are
    last_comm_s_ = StepTimer::now() - t0;
    last_update_s_ = 0.0;
    return norm;
  }
  // One pass: undo the loss scale and clip.
  const double clip = cfg_.optimizer.clip_grad_norm;
  double factor = 1.0 / grad_scale;
  if (clip > 0.0 && std::isfinite(norm) && norm > clip) factor *= clip / (norm + 1e-6);
  if (factor != 1.0) kernels::scale(exec, sharding_.reduced_all(), static_cast<float>(factor));

  opt_.begin_step();
  for (const auto& span : sharding_.update_spans())
    opt_.update(exec, VectorU<float>(span.values, span.n), VectorU<float>(span.grads, span.n), lr,
                span.state_offset);
  exec.fence();
  const double t2 = StepTimer::now();
  sharding_.after_update(exec);
  const double t3 = StepTimer::now();
  last_comm_s_ = (t1 - t0) + (t3 - t2);
  last_update_s_ = t2 - t1;
  return norm;
}

}  // namespace tessera
