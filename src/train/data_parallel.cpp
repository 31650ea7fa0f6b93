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
  bool exchanging = false;  // an exchange was started and its completion not yet handled
  Vector<float> work_grads; // zero >= 2: this bucket's gradients while it needs them
  Vector<float> gathered;   // zero 3: this bucket's values while gathered
};

namespace {
// y += x, element-wise.
void accumulate(const ExecSpace& exec, VectorU<float> y, VectorU<float> x) {
  Kokkos::parallel_for("tessera::DataParallel::accumulate", range(exec, Index(y.size())),
                       KOKKOS_LAMBDA(const Index i) { y(i) += x(i); });
}
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
}  // namespace

int DataParallel::shards(const Config& cfg, const Communicator& comm) {
  return cfg.parallel.zero >= 1 ? comm.size(Group::replica) : 1;
}

std::size_t DataParallel::bucket_elements(const Config& cfg) {
  return std::max<std::size_t>(1, static_cast<std::size_t>(cfg.comm.bucket_mb * 1e6 / sizeof(float)));
}

nn::Storage DataParallel::storage(int zero) {
  nn::Storage s;
  s.full_values = zero < 3;
  s.full_grads = zero < 2;
  return s;
}

DataParallel::DataParallel(const Config& cfg, const Communicator& comm, nn::ParamStore<float>& store)
    : cfg_(cfg),
      comm_(comm),
      store_(store),
      opt_(cfg.optimizer, cfg.parallel.zero >= 1 ? store.shard_size() : store.size()),
      zero_(cfg.parallel.zero),
      shard_rank_(comm.rank(Group::replica)),
      shards_(store.shards()),
      overlap_(cfg.comm.overlap),
      no_sync_(cfg.comm.no_sync),
      buckets_(store.buckets().size()) {
  if (shards_ != shards(cfg, comm) || store.storage().full_values != storage(zero_).full_values ||
      store.storage().full_grads != storage(zero_).full_grads)
    throw std::logic_error("tessera::DataParallel: the store was not planned and allocated for this deck");
  // Our own point-to-point allreduce algorithms have no nonblocking form.
  if (zero_ == 0 && comm.allreduce_algorithm() != AllreduceAlgorithm::mpi) overlap_ = false;
  accumulate_into_shard_ = zero_ >= 1 && cfg.parallel.micro_batches > 1 && (zero_ >= 2 || !no_sync_);
  const std::size_t shard = store.shard_size();
  if (zero_ >= 3) value_shard_ = Vector<float>(mem::label(mem::Category::param, "tessera::DataParallel::value_shard"), shard);
  if (zero_ >= 1) grad_shard_ = Vector<float>(mem::label(mem::Category::grad, "tessera::DataParallel::grad_shard"), shard);
  if (accumulate_into_shard_) recv_ = Vector<float>(mem::label(mem::Category::comm, "tessera::DataParallel::recv"), shard);
}

DataParallel::~DataParallel() = default;

void DataParallel::initialize(const ExecSpace& exec, std::uint64_t seed) {
  if (zero_ < 3) {
    store_.initialize(exec, seed);
    return;
  }
  const auto r = static_cast<std::size_t>(shard_rank_);
  for (const auto& b : store_.buckets())
    store_.initialize_range(exec, seed, b.offset + r * b.chunk, b.offset + (r + 1) * b.chunk,
                            value_shard_.data() + b.shard_offset);
}

void DataParallel::begin_step(const ExecSpace& exec) {
  if (zero_ < 2) store_.zero_grads(exec);
  if (zero_ >= 1) Kokkos::deep_copy(exec, grad_shard_, 0.0f);
  hook_comm_s_ = 0.0;  // what evaluation's forwards spent belongs to no step
}

void DataParallel::begin_backward(const ExecSpace& exec, int m, int count) {
  wait_all();
  sync_ = zero_ >= 2 || !no_sync_ || m == count - 1;
  if (m == 0 || no_sync_) return;
  const int n = comm_.size(Group::replica);
  if (zero_ == 0 && n > 1) {
    // Exchanging every micro-batch in place: the buffer holds the sum so far, the same on every
    // rank; a 1/n share of it from each rank sums back to it as the new gradients add on.
    kernels::scale(exec, store_.grads(), 1.0f / static_cast<float>(n));
  } else if (zero_ == 1) {
    store_.zero_grads(exec);  // the sum so far lives in the shard
  }
}

void DataParallel::end_backward(const ExecSpace& exec) {
  exec.fence();
  poll();
}

void DataParallel::before_forward(std::size_t unit) {
  const HookTimer timer(hook_comm_s_);
  if (zero_ >= 3) gather(store_.bucket_of_unit(unit));
}

void DataParallel::after_forward(std::size_t unit) {
  const HookTimer timer(hook_comm_s_);
  const std::size_t b = store_.bucket_of_unit(unit);
  if (zero_ >= 3 && unit == store_.buckets()[b].last_unit) release_values(b);
}

void DataParallel::before_backward(std::size_t unit) {
  const HookTimer timer(hook_comm_s_);
  const std::size_t b = store_.bucket_of_unit(unit);
  if (zero_ >= 3) gather(b);
  if (zero_ >= 2 && !store_.grads_attached(b)) {
    // Bound the gradient memory: at most one other bucket's exchange in flight while this one
    // fills (otherwise every bucket could be held until the end of the step).
    for (std::size_t other = 0; other < buckets_.size(); ++other)
      if (other != b && other != last_started_ && buckets_[other].exchanging) complete(other);
    auto& s = buckets_[b];
    s.work_grads = Vector<float>(mem::label(mem::Category::grad, "tessera::DataParallel::bucket_grads"),
                                 store_.buckets()[b].length);
    store_.attach_grads(b, s.work_grads.data());
  }
  poll();
}

void DataParallel::after_backward(std::size_t unit) {
  const HookTimer timer(hook_comm_s_);
  const std::size_t b = store_.bucket_of_unit(unit);
  if (unit == store_.buckets()[b].first_unit) {
    if (zero_ >= 3) release_values(b);
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
    const nn::Bucket& b = store_.buckets()[info.bucket];
    float* g = zero_ == 0 ? store_.grads().data() + b.offset : grad_shard_.data() + b.shard_offset;
    const std::size_t n = zero_ == 0 ? b.length : b.chunk;
    if (tied_recv_.extent(0) < n)
      tied_recv_ = Vector<float>(mem::label(mem::Category::comm, "tessera::DataParallel::tied"), n);
    const int partner = info.tie == nn::Tie::original ? stages - 1 : 0;
    const int tag = (1 << 20) + 1;
    PendingOp send = comm_.isend(g, n, partner, tag, Group::pipeline);
    comm_.recv(tied_recv_.data(), n, partner, tag, Group::pipeline);
    send.wait();
    accumulate(exec, VectorU<float>(g, n), VectorU<float>(tied_recv_.data(), n));
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
  const nn::Bucket& bucket = store_.buckets()[b];
  auto& s = buckets_[b];
  float* src = zero_ >= 2 ? s.work_grads.data() : store_.grads().data() + bucket.offset;
  s.exchanging = true;
  last_started_ = b;
  if (zero_ == 0) {
    if (blocking) comm_.allreduce_sum(src, bucket.length, Group::replica);
    else s.op = comm_.iallreduce_sum(src, bucket.length, Group::replica);
  } else {
    float* dst = (accumulate_into_shard_ ? recv_.data() : grad_shard_.data()) + bucket.shard_offset;
    if (blocking) comm_.reduce_scatter_sum(src, dst, bucket.chunk, Group::replica);
    else s.op = comm_.ireduce_scatter_sum(src, dst, bucket.chunk, Group::replica);
  }
  if (blocking) complete(b);
}

void DataParallel::complete(std::size_t b) {
  auto& s = buckets_[b];
  s.op.wait();
  if (!s.exchanging) return;
  s.exchanging = false;
  const nn::Bucket& bucket = store_.buckets()[b];
  if (accumulate_into_shard_)
    accumulate(exec_, VectorU<float>(grad_shard_.data() + bucket.shard_offset, bucket.chunk),
               VectorU<float>(recv_.data() + bucket.shard_offset, bucket.chunk));
  if (zero_ >= 2) {
    store_.attach_grads(b, nullptr);
    s.work_grads = Vector<float>();
  }
}

void DataParallel::poll() {
  for (std::size_t b = 0; b < buckets_.size(); ++b)
    if (buckets_[b].exchanging && buckets_[b].op.test()) complete(b);
}

void DataParallel::wait_all() {
  for (std::size_t b = buckets_.size(); b-- > 0;)
    if (buckets_[b].exchanging) complete(b);
}

void DataParallel::gather(std::size_t b) {
  if (store_.values_attached(b)) return;
  const nn::Bucket& bucket = store_.buckets()[b];
  auto& s = buckets_[b];
  s.gathered = Vector<float>(Kokkos::view_alloc(mem::label(mem::Category::param, "tessera::DataParallel::gathered"),
                                                Kokkos::WithoutInitializing),
                             bucket.length);
  exec_.fence();
  comm_.allgather(value_shard_.data() + bucket.shard_offset, s.gathered.data(), bucket.chunk, Group::replica);
  store_.attach_values(b, s.gathered.data());
}

void DataParallel::release_values(std::size_t b) {
  exec_.fence();  // kernels reading the values are done
  store_.attach_values(b, nullptr);
  buckets_[b].gathered = Vector<float>();
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
  // full buffer is the same on every data rank; shards add up over the data group; tensor blocks
  // and pipeline stages add up over theirs, a block every tensor rank holds counted on rank 0.
  const Vector<float> grads = zero_ == 0 ? store_.grads() : grad_shard_;
  const bool tensor_root = comm_.rank(Group::tensor) == 0;
  double squares = 0.0;
  if (zero_ == 0) {
    for (std::size_t i = 0; i < store_.infos().size(); ++i)
      if ((tensor_root || store_.infos()[i].tensor_sharded) && store_.infos()[i].tie != nn::Tie::copy)
        squares += kernels::sum_squares(exec, store_.grad(i));
  } else {
    for (const auto& piece : shard_pieces())
      if (piece.end > piece.begin && (tensor_root || store_.infos()[piece.param].tensor_sharded) &&
          store_.infos()[piece.param].tie != nn::Tie::copy)
        squares += kernels::sum_squares(
            exec, VectorU<float>(grad_shard_.data() + piece.shard_offset, piece.end - piece.begin));
    comm_.allreduce_sum(&squares, 1, Group::replica);
  }
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
  if (factor != 1.0) kernels::scale(exec, grads, static_cast<float>(factor));

  opt_.begin_step();
  const auto r = static_cast<std::size_t>(shard_rank_);
  if (zero_ == 0) {
    opt_.update(exec, VectorU<float>(store_.values().data(), store_.size()),
                VectorU<float>(grads.data(), grads.size()), lr, 0);
  } else if (zero_ >= 3) {
    opt_.update(exec, VectorU<float>(value_shard_.data(), value_shard_.size()),
                VectorU<float>(grads.data(), grads.size()), lr, 0);
  } else {
    for (const auto& b : store_.buckets())
      opt_.update(exec, VectorU<float>(store_.values().data() + b.offset + r * b.chunk, b.chunk),
                  VectorU<float>(grad_shard_.data() + b.shard_offset, b.chunk), lr, b.shard_offset);
  }
  exec.fence();
  const double t2 = StepTimer::now();

  // zero 1 and 2: every rank gets every bucket's updated chunks back.
  if (zero_ == 1 || zero_ == 2) {
    std::vector<PendingOp> ops;
    for (const auto& b : store_.buckets()) {
      float* base = store_.values().data() + b.offset;
      ops.push_back(comm_.iallgather(base + r * b.chunk, base, b.chunk, Group::replica));
    }
    for (auto& op : ops) op.wait();
  }
  const double t3 = StepTimer::now();
  last_comm_s_ = (t1 - t0) + (t3 - t2);
  last_update_s_ = t2 - t1;
  return norm;
}

std::vector<DataParallel::Piece> DataParallel::shard_pieces() const {
  std::vector<Piece> pieces;
  const auto r = static_cast<std::size_t>(shard_rank_);
  const auto& infos = store_.infos();
  for (std::size_t i = 0; i < infos.size(); ++i) {
    const auto& p = infos[i];
    const nn::Bucket& b = store_.buckets()[p.bucket];
    const std::size_t chunk_begin = b.offset + r * b.chunk, chunk_end = chunk_begin + b.chunk;
    const std::size_t lo = std::max(chunk_begin, p.offset), hi = std::min(chunk_end, p.offset + p.size);
    Piece piece;
    piece.param = i;
    if (lo < hi) {
      piece.begin = lo - p.offset;
      piece.end = hi - p.offset;
      piece.shard_offset = b.shard_offset + (lo - chunk_begin);
    }
    pieces.push_back(piece);
  }
  return pieces;
}

}  // namespace tessera
