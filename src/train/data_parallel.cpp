#include "train/data_parallel.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
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

struct DataParallel::Flight {
  PendingOp op;
  std::size_t bucket = 0;
  bool seen = false;  // its completion counted in undone_
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
      buckets_(store.buckets().size()),
      priority_(cfg.comm.priority) {
  if (!priority_) return;
  if (sharding.state_sharded()) throw std::logic_error("tessera::DataParallel: comm.priority with sharded state");
  const auto elements = [](double mb) { return static_cast<std::size_t>(mb * 1e6 / sizeof(float)); };
  sched_ = std::make_unique<PieceScheduler>(elements(cfg.comm.piece_mb), elements(cfg.comm.inflight_mb));
  undone_.assign(buckets_.size(), 0);
  pending_.assign(buckets_.size(), 0);
}

DataParallel::~DataParallel() = default;

void DataParallel::begin_step(const ExecSpace& exec) {
  if (!priority_) {
    sharding_.begin_step(exec);
  } else {
    // The buckets of the last step still in flight keep their gradients until applied (and
    // cleared then).
    for (std::size_t b = 0; b < buckets_.size(); ++b)
      if (!pending_[b]) {
        const Sharding::UpdateSpan span = sharding_.bucket_span(b);
        Kokkos::deep_copy(exec, VectorU<float>(span.grads, span.n), 0.0f);
      }
  }
  hook_comm_s_ = 0.0;  // what evaluation's forwards spent belongs to no step
}

void DataParallel::begin_backward(const ExecSpace& exec, int m, int count) {
  wait_all();
  updates_open_ = false;  // comm.priority: this step's buckets wait for finish_step's learning rate
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
  const std::size_t b = store_.bucket_of_unit(unit);
  if (priority_) {
    // The last step's update of this bucket must be in before its values are read.
    if (sched_->unretired(b) > 0 || pending_[b]) {
      const double t0 = StepTimer::now();
      wait_bucket(b);
      forward_wait_s_ += StepTimer::now() - t0;
    }
    ++forward_units_;
    if (sched_->in_flight() || sched_->queued()) ++forward_overlapped_;
  }
  sharding_.gather(exec_, b);
}

void DataParallel::after_forward(std::size_t unit) {
  const HookTimer timer(hook_comm_s_);
  if (priority_) poll();
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
  if (priority_) {
    // Its pieces queue behind those of earlier layers' buckets, ahead of later layers'.
    pending_[b] = 1;
    undone_[b] += sched_->add(b, store_.buckets()[b].first_unit, store_.buckets()[b].length);
    poll();
    return;
  }
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
  if (priority_) {
    start_pieces();
    test_pieces();
    apply_done();
    return;
  }
  for (std::size_t b = 0; b < buckets_.size(); ++b) advance(b, false);
}

void DataParallel::wait_all() {
  if (priority_) {
    wait_bucket(static_cast<std::size_t>(-1));
    return;
  }
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
  if (priority_) {
    // No waiting: the previous step's norm (all its buckets were applied before this backward),
    // then this step's update opens; each bucket is applied as its pieces are in.
    finalize_norm();
    const double previous = last_norm_;
    opt_.begin_step();
    lr_ = lr;
    updates_open_ = true;
    norm_open_ = true;
    squares_ = 0.0;
    poll();
    exec.fence();
    skipped_ = false;
    last_comm_s_ = StepTimer::now() - t0;
    last_update_s_ = 0.0;
    return previous;
  }
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
  // The update's own pass undoes the loss scale and clips (a factor on each gradient), and where
  // it covers the whole flat buffer (the state not sharded) also writes the weights' bf16 copies
  // that the next step's products read; sharded updates leave them to be made at first use, after
  // the values are gathered.
  const double clip = cfg_.optimizer.clip_grad_norm;
  kernels::UpdateExtras extras{1.0 / grad_scale, {}};
  if (clip > 0.0 && std::isfinite(norm) && norm > clip) extras.grad_factor *= clip / (norm + 1e-6);
  const std::vector<Sharding::UpdateSpan> spans = sharding_.update_spans();
  const bool whole = spans.size() == 1 && spans[0].values == store_.values().data() && spans[0].n == store_.size();
  if (whole) extras.bf16 = store_.bf16_copies();

  opt_.begin_step();
  for (const auto& span : spans)
    opt_.update(exec, VectorU<float>(span.values, span.n), VectorU<float>(span.grads, span.n), lr,
                span.state_offset, extras);
  exec.fence();
  const double t2 = StepTimer::now();
  sharding_.after_update(exec);
  store_.values_changed();  // the bf16 copies of the weights (ParamStore::bf16_value) are stale...
  if (extras.bf16.extent(0) > 0) store_.bf16_copies_written();  // ...unless the update wrote them
  const double t3 = StepTimer::now();
  last_comm_s_ = (t1 - t0) + (t3 - t2);
  last_update_s_ = t2 - t1;
  last_norm_ = norm;
  return norm;
}

// --- comm.priority --------------------------------------------------------------------------

void DataParallel::start_pieces() {
  for (const PieceScheduler::Piece& p : sched_->startable()) {
    const Sharding::Exchange e = sharding_.exchange(p.bucket);
    flight_.push_back({comm_.iallreduce_sum(e.send + p.offset, p.length, sharding_.group(), comm_.reduce_dtype()),
                       p.bucket, false});
    trace_.push_back(p.bucket);
  }
}

void DataParallel::test_pieces() {
  for (auto& f : flight_)
    if (!f.seen && f.op.test()) {
      f.seen = true;
      piece_done(f.bucket);
    }
}

void DataParallel::retire_oldest() {
  Flight& f = flight_.front();
  f.op.wait();
  if (!f.seen) piece_done(f.bucket);
  flight_.pop_front();
  sched_->retire_oldest();
}

void DataParallel::piece_done(std::size_t b) { --undone_[b]; }

void DataParallel::apply_done() {
  if (!updates_open_) return;
  for (std::size_t b = 0; b < buckets_.size(); ++b)
    if (pending_[b] && undone_[b] == 0) apply(b);
}

void DataParallel::apply(std::size_t b) {
  // The same per-element update as the whole-store one, on this bucket's span alone; a
  // non-finite bucket (and every one after it) leaves the parameters as they are.
  const Sharding::UpdateSpan span = sharding_.bucket_span(b);
  const double squares = sharding_.bucket_grad_squares(exec_, b, comm_.rank(Group::tensor) == 0);
  squares_ += squares;
  if (!std::isfinite(squares)) nonfinite_ = true;
  const VectorU<float> grads(span.grads, span.n);
  if (!nonfinite_) {
    opt_.update(exec_, VectorU<float>(span.values, span.n), grads, lr_, span.state_offset);
    store_.values_changed();
  }
  Kokkos::deep_copy(exec_, grads, 0.0f);
  exec_.fence();
  pending_[b] = 0;
}

void DataParallel::wait_bucket(std::size_t b) {
  // Pieces retire oldest first on every rank alike, so every rank starts the same next pieces.
  const bool all = b == static_cast<std::size_t>(-1);
  while (all ? (sched_->queued() || sched_->in_flight()) : sched_->unretired(b) > 0) {
    start_pieces();
    retire_oldest();
  }
  start_pieces();
  test_pieces();
  apply_done();
}

void DataParallel::finalize_norm() {
  if (!norm_open_) return;
  double squares = squares_;
  if (comm_.size(Group::tensor) > 1) comm_.allreduce_sum(&squares, 1, Group::tensor);
  last_norm_ = nonfinite_ ? std::numeric_limits<double>::quiet_NaN() : std::sqrt(squares);
  norm_open_ = false;
}

double DataParallel::flush() {
  if (!priority_) return last_norm_;
  wait_bucket(static_cast<std::size_t>(-1));
  finalize_norm();
  return last_norm_;
}

std::string DataParallel::take_priority_report() {
  if (!priority_) return {};
  std::string order;
  for (std::size_t i = 0; i < trace_.size();) {
    std::size_t j = i;
    while (j < trace_.size() && trace_[j] == trace_[i]) ++j;
    order += fmt::format("{}b{}x{}", order.empty() ? "" : " ", trace_[i], j - i);
    i = j;
  }
  const std::string line = fmt::format(
      "priority: pieces sent (bucket x pieces, bucket 0 holds the first layers): {}; forward units run "
      "with pieces in flight: {} of {}; waited for a bucket in forward {:.4f} s",
      order.empty() ? "none" : order, forward_overlapped_, forward_units_, forward_wait_s_);
  trace_.clear();
  forward_units_ = forward_overlapped_ = 0;
  forward_wait_s_ = 0.0;
  return line;
}

}  // namespace tessera
