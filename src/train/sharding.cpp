#include "train/sharding.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <stdexcept>

#include "core/error.hpp"
#include "core/memory.hpp"
#include "kernels/reduce.hpp"

namespace tessera {

namespace {
// y += x, element-wise.
void accumulate(const ExecSpace& exec, VectorU<float> y, VectorU<float> x) {
  Kokkos::parallel_for("tessera::Sharding::accumulate", range(exec, Index(y.size())),
                       KOKKOS_LAMBDA(const Index i) { y(i) += x(i); });
}
}  // namespace

ParamLayout Sharding::layout(const Config& cfg, int shards) {
  const int zero = cfg.parallel.zero;
  ParamLayout l;
  l.shards = zero >= 1 ? shards : 1;
  l.bucket_elements = std::max<std::size_t>(1, static_cast<std::size_t>(cfg.comm.bucket_mb * 1e6 / sizeof(float)));
  l.storage.full_values = zero < 3;
  l.storage.full_grads = zero < 2;
  return l;
}

namespace {
Group sharding_group(const Config& cfg, const Communicator& comm) {
  if (cfg.parallel.zero_group != ZeroGroup::node) return Group::replica;
  if (!comm.replica_nodes_even())
    throw InputError(fmt::format(
        "parallel.zero_group = \"node\" shards within each node and pairs the shards up across nodes, "
        "but the nodes hold different numbers of ranks of a replica group ({} here, on {} ranks in all); "
        "give every node the same number of ranks, or set parallel.zero_group = \"data\"",
        comm.size(Group::replica_node), comm.size()));
  return Group::replica_node;
}
}  // namespace

Sharding::Sharding(const Config& cfg, const Communicator& comm)
    : comm_(comm),
      group_(sharding_group(cfg, comm)),
      layout_(layout(cfg, comm.size(group_))),
      zero_(cfg.parallel.zero),
      across_nodes_(group_ == Group::replica_node && comm.size(Group::replica_cross) > 1),
      shards_(layout_.shards),
      rank_(comm.rank(group_)),
      writes_pieces_(!across_nodes_ || comm.rank(Group::replica_cross) == 0),
      values_sharded_(!layout_.storage.full_values),
      grads_sharded_(!layout_.storage.full_grads),
      state_sharded_(zero_ >= 1),
      // With several micro-batches a shard receives a sum per micro-batch (every one at zero >= 2,
      // where there is no full buffer to accumulate in; every one without no_sync) and adds it up.
      accumulate_into_shard_(state_sharded_ && cfg.parallel.micro_batches > 1 &&
                             (grads_sharded_ || !cfg.comm.no_sync)) {}

Sharding::~Sharding() = default;

void Sharding::bind(nn::ParamStore<float>& store) {
  if (store.shards() != layout_.shards || store.storage().full_values != layout_.storage.full_values ||
      store.storage().full_grads != layout_.storage.full_grads)
    throw std::logic_error("tessera::Sharding: the store was not planned and allocated from layout()");
  store_ = &store;
  buckets_.assign(store.buckets().size(), {});
  const std::size_t shard = store.shard_size();
  if (values_sharded_)
    value_shard_ = Vector<float>(mem::label(mem::Category::param, "tessera::Sharding::value_shard"), shard);
  if (state_sharded_)
    grad_shard_ = Vector<float>(mem::label(mem::Category::grad, "tessera::Sharding::grad_shard"), shard);
  if (accumulate_into_shard_)
    recv_ = Vector<float>(mem::label(mem::Category::comm, "tessera::Sharding::recv"), shard);
}

std::string Sharding::describe() const {
  const int n = comm_.size(group_);
  if (group_ == Group::replica_node)
    return fmt::format("ZeRO stage {} within each node ({} rank{} per shard group), replicated across {} "
                       "node{}", zero_, n, n == 1 ? "" : "s", comm_.size(Group::replica_cross),
                       comm_.size(Group::replica_cross) == 1 ? "" : "s");
  return fmt::format("ZeRO stage {} over the replica group ({} rank{})", zero_, n, n == 1 ? "" : "s");
}

std::size_t Sharding::state_size() const {
  return state_sharded_ ? store_->shard_size() : store_->size();
}

void Sharding::initialize(const ExecSpace& exec, std::uint64_t seed) {
  if (!values_sharded_) {
    store_->initialize(exec, seed);
    return;
  }
  const auto r = static_cast<std::size_t>(rank_);
  for (const auto& b : store_->buckets())
    store_->initialize_range(exec, seed, b.offset + r * b.chunk, b.offset + (r + 1) * b.chunk,
                             value_shard_.data() + b.shard_offset);
}

Vector<float> Sharding::values() const { return values_sharded_ ? value_shard_ : store_->values(); }

void Sharding::begin_step(const ExecSpace& exec) {
  if (!grads_sharded_) store_->zero_grads(exec);
  if (state_sharded_) Kokkos::deep_copy(exec, grad_shard_, 0.0f);
}

void Sharding::prepare_resync(const ExecSpace& exec, bool first_micro_batch) {
  if (first_micro_batch || grads_sharded_) return;  // a fresh working buffer per bucket
  const int n = comm_.size(group());
  if (!state_sharded_ && n > 1) {
    // Exchanging every micro-batch in place: the buffer holds the sum so far, the same on every
    // rank; a 1/n share of it from each rank sums back to it as the new gradients add on.
    kernels::scale(exec, store_->grads(), 1.0f / static_cast<float>(n));
  } else if (state_sharded_) {
    store_->zero_grads(exec);  // the sum so far lives in the shard
  }
}

bool Sharding::needs_grad_buffer(std::size_t b) const { return grads_sharded_ && !store_->grads_attached(b); }

void Sharding::attach_grad_buffer(std::size_t b) {
  auto& s = buckets_[b];
  s.grads = Vector<float>(mem::label(mem::Category::grad, "tessera::Sharding::bucket_grads"),
                          store_->buckets()[b].length);
  store_->attach_grads(b, s.grads.data());
}

Sharding::Exchange Sharding::exchange(std::size_t b) {
  const nn::Bucket& bucket = store_->buckets()[b];
  Exchange e;
  e.send = grads_sharded_ ? buckets_[b].grads.data() : store_->grads().data() + bucket.offset;
  e.length = bucket.length;
  e.chunk = bucket.chunk;
  e.scatter = state_sharded_;
  e.across_nodes = across_nodes_ && e.scatter;
  e.recv = !e.scatter ? e.send : (accumulate_into_shard_ ? recv_ : grad_shard_).data() + bucket.shard_offset;
  return e;
}

void Sharding::exchanged(const ExecSpace& exec, std::size_t b) {
  const nn::Bucket& bucket = store_->buckets()[b];
  if (accumulate_into_shard_)
    accumulate(exec, VectorU<float>(grad_shard_.data() + bucket.shard_offset, bucket.chunk),
               VectorU<float>(recv_.data() + bucket.shard_offset, bucket.chunk));
  if (grads_sharded_) {
    store_->attach_grads(b, nullptr);
    buckets_[b].grads = Vector<float>();
  }
}

VectorU<float> Sharding::reduced(std::size_t b) const {
  const nn::Bucket& bucket = store_->buckets()[b];
  if (state_sharded_) return VectorU<float>(grad_shard_.data() + bucket.shard_offset, bucket.chunk);
  return VectorU<float>(store_->grads().data() + bucket.offset, bucket.length);
}

double Sharding::grad_squares(const ExecSpace& exec, const std::vector<char>& counted) const {
  double squares = 0.0;
  if (!state_sharded_) {
    for (std::size_t i = 0; i < counted.size(); ++i)
      if (counted[i] != 0) squares += kernels::sum_squares(exec, store_->grad(i));
    return squares;
  }
  for (const auto& piece : pieces())
    if (piece.end > piece.begin && counted[piece.param] != 0)
      squares += kernels::sum_squares(
          exec, VectorU<float>(grad_shard_.data() + piece.shard_offset, piece.end - piece.begin));
  comm_.allreduce_sum(&squares, 1, group());
  return squares;
}

std::vector<Sharding::UpdateSpan> Sharding::update_spans() const {
  if (!state_sharded_)
    return {{store_->values().data(), store_->grads().data(), store_->size(), 0}};
  if (values_sharded_)
    return {{value_shard_.data(), grad_shard_.data(), value_shard_.size(), 0}};
  // Full values, sharded update: this rank's chunk of every bucket.
  std::vector<UpdateSpan> spans;
  for (std::size_t b = 0; b < store_->buckets().size(); ++b) spans.push_back(bucket_span(b));
  return spans;
}

Sharding::UpdateSpan Sharding::bucket_span(std::size_t b) const {
  const nn::Bucket& bucket = store_->buckets()[b];
  if (!state_sharded_)
    return {store_->values().data() + bucket.offset, store_->grads().data() + bucket.offset, bucket.length,
            bucket.offset};
  float* values = values_sharded_ ? value_shard_.data() + bucket.shard_offset
                                  : store_->values().data() + bucket.offset + static_cast<std::size_t>(rank_) * bucket.chunk;
  return {values, grad_shard_.data() + bucket.shard_offset, bucket.chunk, bucket.shard_offset};
}

void Sharding::after_update(const ExecSpace& exec) {
  if (!state_sharded_ || values_sharded_) return;
  exec.fence();
  std::vector<PendingOp> ops;
  const auto r = static_cast<std::size_t>(rank_);
  for (const auto& b : store_->buckets()) {
    float* base = store_->values().data() + b.offset;
    ops.push_back(comm_.iallgather(base + r * b.chunk, base, b.chunk, group()));
  }
  for (auto& op : ops) op.wait();
}

void Sharding::gather(const ExecSpace& exec, std::size_t b) {
  if (!values_sharded_ || store_->values_attached(b)) return;
  const nn::Bucket& bucket = store_->buckets()[b];
  auto& s = buckets_[b];
  s.gathered = Vector<float>(Kokkos::view_alloc(mem::label(mem::Category::param, "tessera::Sharding::gathered"),
                                                Kokkos::WithoutInitializing),
                             bucket.length);
  exec.fence();
  comm_.allgather(value_shard_.data() + bucket.shard_offset, s.gathered.data(), bucket.chunk, group());
  store_->attach_values(b, s.gathered.data());
}

void Sharding::release(const ExecSpace& exec, std::size_t b) {
  if (!values_sharded_) return;
  exec.fence();  // kernels reading the values are done
  store_->attach_values(b, nullptr);
  buckets_[b].gathered = Vector<float>();
}

std::vector<Sharding::Piece> Sharding::pieces() const {
  std::vector<Piece> out;
  const auto r = static_cast<std::size_t>(rank_);
  const auto& infos = store_->infos();
  for (std::size_t i = 0; i < infos.size(); ++i) {
    const auto& p = infos[i];
    const nn::Bucket& b = store_->buckets()[p.bucket];
    const std::size_t chunk_begin = b.offset + r * b.chunk, chunk_end = chunk_begin + b.chunk;
    const std::size_t lo = std::max(chunk_begin, p.offset), hi = std::min(chunk_end, p.offset + p.size);
    Piece piece;
    piece.param = i;
    if (lo < hi) {
      piece.begin = lo - p.offset;
      piece.end = hi - p.offset;
      piece.shard_offset = b.shard_offset + (lo - chunk_begin);
    }
    out.push_back(piece);
  }
  return out;
}

}  // namespace tessera
