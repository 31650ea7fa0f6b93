#include "train/optimizer_step.hpp"

#include <cmath>
#include <limits>

#include "comm/agree.hpp"
#include "core/error.hpp"
#include "core/memory.hpp"
#include "kernels/reduce.hpp"
#include "train/step_timer.hpp"

namespace tessera {

namespace {
// y += x, element-wise.
void accumulate(const ExecSpace& exec, VectorU<float> y, VectorU<float> x) {
  Kokkos::parallel_for("tessera::OptimizerStep::accumulate", range(exec, Index(y.size())),
                       KOKKOS_LAMBDA(const Index i) { y(i) += x(i); });
}
}  // namespace

OptimizerStep::OptimizerStep(const Config& cfg, const Communicator& comm, nn::ParamStore<float>& store,
                             Sharding& sharding)
    : cfg_(cfg),
      comm_(comm),
      store_(store),
      sharding_(sharding),
      opt_(cfg.optimizer, sharding.state_size(), comm.rank(), sharding.value_file()) {
  const bool tensor_root = comm.rank(Group::tensor) == 0;
  const auto& infos = store.infos();
  counted_.resize(infos.size());
  for (std::size_t i = 0; i < infos.size(); ++i)
    counted_[i] = (tensor_root || infos[i].tensor_sharded) && infos[i].tie != nn::Tie::copy ? 1 : 0;
  for (const nn::Bucket& bucket : store.buckets()) {
    std::vector<char> mask(infos.size(), 0);
    for (std::size_t i = bucket.first_param; i < bucket.end_param; ++i) mask[i] = counted_[i];
    bucket_counted_.push_back(std::move(mask));
  }
}

void OptimizerStep::sum_tied_gradients(const ExecSpace& exec) {
  const int stages = comm_.size(Group::pipeline);
  for (const auto& info : store_.infos()) {
    if (info.tie == nn::Tie::none || stages == 1) continue;
    // The tied parameter is alone in its bucket on both stages, so the two buckets (and their
    // shards) are laid out alike: sum them element by element. a + b on one side and b + a on
    // the other give the same bits.
    const VectorU<float> g = sharding_.reduced(info.bucket);
    const std::size_t n = g.size();
    if (tied_recv_.extent(0) < n)
      tied_recv_ = Vector<float>(mem::label(mem::Category::comm, "tessera::OptimizerStep::tied"), n);
    const int partner = info.tie == nn::Tie::original ? stages - 1 : 0;
    const int tag = (1 << 20) + 1;
    PendingOp send = comm_.isend(g.data(), n, partner, tag, Group::pipeline);
    comm_.recv(tied_recv_.data(), n, partner, tag, Group::pipeline);
    send.wait();
    accumulate(exec, g, VectorU<float>(tied_recv_.data(), n));
    exec.fence();
  }
}

StepReport OptimizerStep::run(const ExecSpace& exec, double lr, double grad_scale, bool skip_nonfinite) {
  const double t0 = StepTimer::now();
  sum_tied_gradients(exec);
  const double t1 = StepTimer::now();

  // The global gradient norm: the sum of squares of every parameter's logical gradient once. The
  // sharding adds up what the replica group holds; tensor blocks and pipeline stages add up over
  // their groups.
  double squares = sharding_.grad_squares(exec, counted_);
  if (comm_.size(Group::tensor) > 1) comm_.allreduce_sum(&squares, 1, Group::tensor);
  if (comm_.size(Group::pipeline) > 1) comm_.allreduce_sum(&squares, 1, Group::pipeline);
  StepReport report;
  report.grad_norm = std::sqrt(squares) / grad_scale;
  report.skipped = skip_nonfinite && !std::isfinite(report.grad_norm);
  if (report.skipped) {  // an overflow: leave parameters and optimizer state as they are
    report.comm_s = StepTimer::now() - t0;
    return report;
  }
  // The update's own pass undoes the loss scale and clips (a factor on each gradient), and where
  // it covers the whole flat buffer (the state not sharded) also writes the weights' bf16 copies
  // that the next step's products read; sharded updates leave them to be made at first use, after
  // the values are gathered.
  const double clip = cfg_.optimizer.clip_grad_norm;
  const double norm = report.grad_norm;
  kernels::UpdateExtras extras{1.0 / grad_scale, {}};
  if (clip > 0.0 && std::isfinite(norm) && norm > clip) extras.grad_factor *= clip / (norm + 1e-6);
  const std::vector<Sharding::UpdateSpan> spans = sharding_.update_spans();
  const bool whole = spans.size() == 1 && spans[0].values != nullptr && spans[0].values == store_.values().data() &&
                     spans[0].n == store_.size();
  if (whole) extras.bf16 = store_.bf16_copies();

  sharding_.before_update();
  opt_.begin_step();
  // An offloaded state's I/O may fail on one rank (a full disk, EIO): every rank learns it here,
  // before the allgather, and the run stops with the last checkpoint intact.
  std::string io_error;
  try {
    for (const auto& span : spans)
      opt_.update(exec, VectorU<float>(span.values, span.n), VectorU<float>(span.grads, span.n), lr,
                  span.state_offset, extras);
  } catch (const InputError& e) {
    if (!opt_.streams_files()) throw;
    io_error = e.what();
  }
  exec.fence();
  if (opt_.streams_files())
    agree(comm_.handle(), [&] {
      if (!io_error.empty()) throw InputError(io_error);
    });
  const double t2 = StepTimer::now();
  sharding_.after_update(exec);
  store_.values_changed();  // the bf16 copies of the weights (ParamStore::bf16_value) are stale...
  if (extras.bf16.extent(0) > 0) store_.bf16_copies_written();  // ...unless the update wrote them
  const double t3 = StepTimer::now();
  report.comm_s = (t1 - t0) + (t3 - t2);
  report.update_s = t2 - t1;
  last_norm_ = norm;
  return report;
}

void OptimizerStep::open(double lr) {
  opt_.begin_step();
  lr_ = lr;
  squares_ = 0.0;
  open_ = true;
}

void OptimizerStep::apply_bucket(const ExecSpace& exec, std::size_t b) {
  // The same per-element update as the whole-store one, on this bucket's span alone; a
  // non-finite bucket (and every one after it) leaves the parameters as they are.
  const Sharding::UpdateSpan span = sharding_.bucket_span(b);
  const double squares = sharding_.grad_squares(exec, bucket_counted_[b]);
  squares_ += squares;
  if (!std::isfinite(squares)) nonfinite_ = true;
  if (nonfinite_) return;
  opt_.update(exec, VectorU<float>(span.values, span.n), VectorU<float>(span.grads, span.n), lr_, span.state_offset);
  store_.values_changed();
}

double OptimizerStep::close() {
  if (!open_) return last_norm_;
  double squares = squares_;
  if (comm_.size(Group::tensor) > 1) comm_.allreduce_sum(&squares, 1, Group::tensor);
  last_norm_ = nonfinite_ ? std::numeric_limits<double>::quiet_NaN() : std::sqrt(squares);
  open_ = false;
  return last_norm_;
}

}  // namespace tessera
