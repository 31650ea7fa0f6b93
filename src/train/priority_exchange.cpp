#include "train/priority_exchange.hpp"

#include <fmt/format.h>

#include <stdexcept>

#include "train/step_timer.hpp"

namespace tessera {

PriorityExchange::PriorityExchange(const Config& cfg, const Communicator& comm, nn::ParamStore<float>& store,
                                   Sharding& sharding, OptimizerStep& step)
    : comm_(comm), store_(store), sharding_(sharding), step_(step), no_sync_(cfg.comm.no_sync) {
  if (sharding.state_sharded()) throw std::logic_error("tessera::PriorityExchange: comm.priority with sharded state");
  const auto elements = [](double mb) { return static_cast<std::size_t>(mb * 1e6 / sizeof(float)); };
  sched_ = std::make_unique<PieceScheduler>(elements(cfg.comm.piece_mb), elements(cfg.comm.inflight_mb));
  undone_.assign(store.buckets().size(), 0);
  pending_.assign(store.buckets().size(), 0);
}

PriorityExchange::~PriorityExchange() = default;

void PriorityExchange::begin_step(const ExecSpace& exec) {
  // The buckets of the last step still in flight keep their gradients until applied (and
  // cleared then).
  for (std::size_t b = 0; b < pending_.size(); ++b)
    if (!pending_[b]) {
      const Sharding::UpdateSpan span = sharding_.bucket_span(b);
      Kokkos::deep_copy(exec, VectorU<float>(span.grads, span.n), 0.0f);
    }
  forget_hook_comm_seconds();
}

void PriorityExchange::begin_backward(const ExecSpace& exec, int m, int count) {
  wait_bucket(static_cast<std::size_t>(-1));
  updates_open_ = false;  // this step's buckets wait for finish_step's learning rate
  // no_sync: gradients accumulate locally until the last micro-batch, where a full buffer holds them.
  sync_ = !no_sync_ || sharding_.grads_sharded() || m == count - 1;
  if (!no_sync_) sharding_.prepare_resync(exec, m == 0);
}

void PriorityExchange::end_backward(const ExecSpace& exec) {
  exec.fence();
  poll();
}

void PriorityExchange::before_forward(std::size_t unit) {
  const HookTimer timer(*this);
  const std::size_t b = store_.bucket_of_unit(unit);
  // The last step's update of this bucket must be in before its values are read.
  if (sched_->unretired(b) > 0 || pending_[b]) {
    const double t0 = StepTimer::now();
    wait_bucket(b);
    forward_wait_s_ += StepTimer::now() - t0;
  }
  ++forward_units_;
  if (sched_->in_flight() || sched_->queued()) ++forward_overlapped_;
  sharding_.gather(exec_, b);
}

void PriorityExchange::after_forward(std::size_t unit) {
  const HookTimer timer(*this);
  poll();
  const std::size_t b = store_.bucket_of_unit(unit);
  if (unit == store_.buckets()[b].last_unit) sharding_.release(exec_, b);
}

void PriorityExchange::before_backward(std::size_t unit) {
  const HookTimer timer(*this);
  sharding_.gather(exec_, store_.bucket_of_unit(unit));
  poll();
}

void PriorityExchange::after_backward(std::size_t unit) {
  const HookTimer timer(*this);
  const std::size_t b = store_.bucket_of_unit(unit);
  if (unit == store_.buckets()[b].first_unit) {
    sharding_.release(exec_, b);
    if (sync_) {  // no-sync: accumulate locally until the last micro-batch
      exec_.fence();
      // Its pieces queue behind those of earlier layers' buckets, ahead of later layers'.
      pending_[b] = 1;
      undone_[b] += sched_->add(b, store_.buckets()[b].first_unit, store_.buckets()[b].length);
    }
  }
  poll();
}

StepReport PriorityExchange::finish_step(const ExecSpace& exec, double lr, double /*grad_scale*/,
                                         bool /*skip_nonfinite*/) {
  const double t0 = StepTimer::now();
  end_backward(exec);
  // No waiting: the previous step's norm (all its buckets were applied before this backward),
  // then this step's update opens; each bucket is applied as its pieces are in.
  StepReport report;
  report.grad_norm = step_.close();
  step_.open(lr);
  updates_open_ = true;
  poll();
  exec.fence();
  report.comm_s = StepTimer::now() - t0;
  return report;
}

void PriorityExchange::poll() {
  start_pieces();
  test_pieces();
  apply_done();
}

void PriorityExchange::start_pieces() {
  for (const PieceScheduler::Piece& p : sched_->startable()) {
    const Sharding::Exchange e = sharding_.exchange(p.bucket);
    flight_.push_back({comm_.iallreduce_sum(e.send + p.offset, p.length, sharding_.group(), comm_.reduce_dtype()),
                       p.bucket, false});
    trace_.push_back(p.bucket);
  }
}

void PriorityExchange::test_pieces() {
  for (auto& f : flight_)
    if (!f.seen && f.op.test()) {
      f.seen = true;
      --undone_[f.bucket];
    }
}

void PriorityExchange::retire_oldest() {
  Flight& f = flight_.front();
  f.op.wait();
  if (!f.seen) --undone_[f.bucket];
  flight_.pop_front();
  sched_->retire_oldest();
}

void PriorityExchange::apply_done() {
  if (!updates_open_) return;
  for (std::size_t b = 0; b < pending_.size(); ++b) {
    if (!pending_[b] || undone_[b] != 0) continue;
    step_.apply_bucket(exec_, b);
    const Sharding::UpdateSpan span = sharding_.bucket_span(b);
    Kokkos::deep_copy(exec_, VectorU<float>(span.grads, span.n), 0.0f);
    exec_.fence();
    pending_[b] = 0;
  }
}

void PriorityExchange::wait_bucket(std::size_t b) {
  // Pieces retire oldest first on every rank alike, so every rank starts the same next pieces.
  const bool all = b == static_cast<std::size_t>(-1);
  while (all ? (sched_->queued() || sched_->in_flight()) : sched_->unretired(b) > 0) {
    start_pieces();
    retire_oldest();
  }
  poll();
}

std::optional<double> PriorityExchange::flush() {
  wait_bucket(static_cast<std::size_t>(-1));
  return step_.close();
}

std::string PriorityExchange::take_report() {
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
