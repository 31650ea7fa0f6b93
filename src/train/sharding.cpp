#include "train/sharding.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <new>
#include <stdexcept>

#include "comm/agree.hpp"
#include "core/error.hpp"
#include "core/memory.hpp"
#include "kernels/reduce.hpp"
#include "optim/state_file.hpp"

namespace tessera {

namespace {
constexpr std::size_t kBounce = Sharding::kValueBuffer;
static_assert(kBounce % StateFile::kBlock == 0, "whole blocks of the value file");

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

bool Sharding::accumulates_into_shard(const Config& cfg) {
  return cfg.parallel.zero >= 1 && cfg.parallel.micro_batches > 1 && (cfg.parallel.zero >= 2 || !cfg.comm.no_sync);
}

bool Sharding::grads_in_shard(const Config& cfg, int shards) {
  return cfg.parallel.zero >= 2 && shards == 1 && !accumulates_into_shard(cfg);
}

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
      accumulate_into_shard_(accumulates_into_shard(cfg)),
      grads_in_shard_(grads_in_shard(cfg, shards_)),
      value_dir_(cfg.optimizer.offload_values && values_sharded_ ? offload_dir(cfg.optimizer.offload_path) : ""),
      world_rank_(comm.rank()),
      prefetch_(gathers_ahead(cfg, shards_)) {}

bool Sharding::gathers_ahead(const Config& cfg, int shards) {
  // Host memory only: a GPU build gathers each bucket when it is needed.
  return cfg.parallel.zero >= 3 && cfg.parallel.zero_prefetch && (shards > 1 || cfg.optimizer.offload_values) &&
         Kokkos::SpaceAccessibility<HostSpace, Vector<float>::memory_space>::accessible;
}

Sharding::~Sharding() {
  drop_ahead();  // before the buffers its read or allgather writes
  value_io_.reset();
  const int buffers = (bounce_ ? 1 : 0) + (ahead_bounce_ ? 1 : 0);
  if (buffers > 0) mem::count_external(mem::Category::param, -static_cast<std::int64_t>(buffers * kBounce * sizeof(float)));
}

void Sharding::FreeFloats::operator()(float* p) const { std::free(p); }

void Sharding::bind(nn::ParamStore<float>& store) {
  if (store.shards() != layout_.shards || store.storage().full_values != layout_.storage.full_values ||
      store.storage().full_grads != layout_.storage.full_grads)
    throw std::logic_error("tessera::Sharding: the store was not planned and allocated from layout()");
  store_ = &store;
  buckets_.assign(store.buckets().size(), {});
  const std::size_t shard = store.shard_size();
  std::size_t largest = 0, largest_chunk = 0;
  for (const auto& b : store.buckets()) {
    largest = std::max(largest, b.length);
    largest_chunk = std::max(largest_chunk, b.chunk);
  }
  if (grads_sharded_ && !grads_in_shard_)
    grad_buffers_ = BufferPool(mem::Category::grad, "tessera::Sharding::bucket_grads", largest);
  if (values_sharded_) gather_buffers_ = BufferPool(mem::Category::param, "tessera::Sharding::gathered", largest);
  if (!value_dir_.empty()) {
    value_file_ = std::make_unique<StateFile>(value_dir_, world_rank_, 1, shard, "values");
    void* p = std::aligned_alloc(StateFile::kBlock * sizeof(float), kBounce * sizeof(float));
    if (p == nullptr) throw std::bad_alloc();
    bounce_.reset(static_cast<float*>(p));
    mem::count_external(mem::Category::param, static_cast<std::int64_t>(kBounce * sizeof(float)));
    if (prefetch_) {
      void* q = std::aligned_alloc(StateFile::kBlock * sizeof(float), kBounce * sizeof(float));
      if (q == nullptr) throw std::bad_alloc();
      ahead_bounce_.reset(static_cast<float*>(q));
      mem::count_external(mem::Category::param, static_cast<std::int64_t>(kBounce * sizeof(float)));
    }
    if (shards_ > 1)
      value_chunk_ = Vector<float>(Kokkos::view_alloc(mem::label(mem::Category::param, "tessera::Sharding::value_chunk"),
                                                      Kokkos::WithoutInitializing),
                                   largest_chunk);
  } else if (values_sharded_) {
    value_shard_ = Vector<float>(mem::label(mem::Category::param, "tessera::Sharding::value_shard"), shard);
  }
  if (state_sharded_)
    grad_shard_ = Vector<float>(mem::label(mem::Category::grad, "tessera::Sharding::grad_shard"), shard);
  if (accumulate_into_shard_)
    recv_ = Vector<float>(mem::label(mem::Category::comm, "tessera::Sharding::recv"), shard);
  follows_.assign(buckets_.size(), kNone);
}

std::string Sharding::describe() const {
  const int n = comm_.size(group_);
  const std::string ahead = prefetch_ ? "; each bucket's next gathered ahead while it computes" : "";
  if (group_ == Group::replica_node)
    return fmt::format("ZeRO stage {} within each node ({} rank{} per shard group), replicated across {} "
                       "node{}{}", zero_, n, n == 1 ? "" : "s", comm_.size(Group::replica_cross),
                       comm_.size(Group::replica_cross) == 1 ? "" : "s", ahead);
  return fmt::format("ZeRO stage {} over the replica group ({} rank{}){}", zero_, n, n == 1 ? "" : "s", ahead);
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
  for (const auto& b : store_->buckets()) {
    if (!value_file_) {
      store_->initialize_range(exec, seed, b.offset + r * b.chunk, b.offset + (r + 1) * b.chunk,
                               value_shard_.data() + b.shard_offset);
      continue;
    }
    // On disk: the bucket's chunk made in memory, then written to its place in the file.
    const Vector<float> chunk(mem::label(mem::Category::param, "tessera::Sharding::value_chunk"), b.chunk);
    store_->initialize_range(exec, seed, b.offset + r * b.chunk, b.offset + (r + 1) * b.chunk, chunk.data());
    exec.fence();
    const auto h = Kokkos::create_mirror_view_and_copy(HostSpace(), chunk);
    write_values(b.shard_offset, b.chunk, h.data());
  }
}

std::size_t Sharding::values_size() const { return values_sharded_ ? store_->shard_size() : store_->size(); }

void Sharding::copy_values(std::size_t at, std::size_t n, float* out) const {
  if (at + n > values_size()) throw std::logic_error("tessera::Sharding::copy_values: beyond the values");
  if (value_file_) {
    settle_read();  // one reader of the file at a time
    read_values(at, n, out);
    return;
  }
  const Vector<float> all = values_sharded_ ? value_shard_ : store_->values();
  Kokkos::deep_copy(Kokkos::View<float*, HostSpace, Kokkos::MemoryUnmanaged>(out, n),
                    Kokkos::subview(all, std::pair<std::size_t, std::size_t>(at, at + n)));
}

void Sharding::set_values(std::size_t at, std::size_t n, const float* in) {
  if (at + n > values_size()) throw std::logic_error("tessera::Sharding::set_values: beyond the values");
  drop_ahead();  // gathered from the values before these
  if (value_file_) {
    write_values(at, n, in);
    return;
  }
  const Vector<float> all = values_sharded_ ? value_shard_ : store_->values();
  Kokkos::deep_copy(Kokkos::subview(all, std::pair<std::size_t, std::size_t>(at, at + n)),
                    Kokkos::View<const float*, HostSpace, Kokkos::MemoryUnmanaged>(in, n));
}

std::string Sharding::describe_values() const {
  if (!value_file_) return "memory";
  return fmt::format("disk, {:.1f} MB in {}; each bucket's chunk read before its gather through a {:.1f} MB buffer, "
                     "and streamed with the optimizer state by the update",
                     static_cast<double>(values_size()) * sizeof(float) / 1e6, value_file_->describe(),
                     static_cast<double>(kBounce) * sizeof(float) / 1e6);
}

void Sharding::read_values(std::size_t begin, std::size_t count, float* out) const {
  value_file_->read_range(0, begin, count, out, bounce_.get(), kBounce);
}

void Sharding::write_values(std::size_t begin, std::size_t count, const float* in) {
  value_file_->write_range(0, begin, count, in, bounce_.get(), kBounce);
}

void Sharding::begin_step(const ExecSpace& exec) {
  if (!order_.empty()) {  // (a step without a gather teaches nothing)
    last_order_ = std::move(order_);
    last_update_at_ = update_at_;
  }
  order_.clear();
  update_at_ = kNone;
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
  if (grads_in_shard_) {  // zeroed by begin_step(), as a fresh buffer would be
    store_->attach_grads(b, grad_shard_.data() + store_->buckets()[b].shard_offset);
    return;
  }
  auto& s = buckets_[b];
  const std::size_t n = store_->buckets()[b].length;
  s.grads = grad_buffers_.take(n);
  Kokkos::deep_copy(VectorU<float>(s.grads, n), 0.0f);  // a gradient accumulates from zero
  store_->attach_grads(b, s.grads);
}

Sharding::Exchange Sharding::exchange(std::size_t b) {
  const nn::Bucket& bucket = store_->buckets()[b];
  Exchange e;
  e.send = grads_in_shard_  ? grad_shard_.data() + bucket.shard_offset
           : grads_sharded_ ? buckets_[b].grads
                            : store_->grads().data() + bucket.offset;
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
    if (buckets_[b].grads != nullptr) grad_buffers_.give(buckets_[b].grads);
    buckets_[b].grads = nullptr;
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
  if (values_sharded_)  // the values in memory, or (nullptr) in the value file
    return {{value_file_ ? nullptr : value_shard_.data(), grad_shard_.data(), store_->shard_size(), 0}};
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
  if (value_file_) return {nullptr, grad_shard_.data() + bucket.shard_offset, bucket.chunk, bucket.shard_offset};
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
  const auto t0 = std::chrono::steady_clock::now();
  const nn::Bucket& bucket = store_->buckets()[b];
  auto& s = buckets_[b];
  // This step's k-th gather; the last step's (k+1)-th is next where their k-th ones agree. Where they
  // do not (an evaluation's gathers, which count on after the step before), the bucket that came
  // after b the last time. (A bound keeps a run without steps from growing the order.)
  const std::size_t k = order_.size();
  if (k < kOrderBound) order_.push_back(b);
  const bool in_order = k < last_order_.size() && last_order_[k] == b;
  const std::size_t next = !prefetch_                          ? kNone
                           : !in_order                         ? follows_[b]
                           : k + 1 == last_update_at_ || k + 1 == last_order_.size() ? kNone  // the update came next
                                                                                      : last_order_[k + 1];
  if (previous_ != kNone) follows_[previous_] = b;
  previous_ = b;
  ++counts_.gathers;
  exec.fence();
  if (ahead_.bucket == b) {
    finish_ahead();
    ++counts_.ahead;
  } else {
    settle_read();  // a bucket asked for out of turn: the read ahead of another leaves the file first
    s.gathered = gather_buffers_.take(bucket.length);
    if (value_file_ && shards_ == 1 && Kokkos::SpaceAccessibility<HostSpace, Vector<float>::memory_space>::accessible) {
      // Alone in the group: the bucket straight from the file.
      const double before = value_file_->bytes_read();
      read_values(bucket.shard_offset, bucket.chunk, s.gathered);
      gather_read_ += value_file_->bytes_read() - before;
    } else if (value_file_) {
      // A read failing on one rank (EIO) stops every rank of the group here, with its line, rather
      // than leaving them in the allgather.
      // This rank's chunk from the file, then gathered as from memory.
      const VectorU<float> chunk(value_chunk_.data(), bucket.chunk);
      const auto h = Kokkos::create_mirror_view(chunk);
      const double before = value_file_->bytes_read();
      agree(comm_.handle(group()), [&] { read_values(bucket.shard_offset, bucket.chunk, h.data()); });
      gather_read_ += value_file_->bytes_read() - before;
      Kokkos::deep_copy(chunk, h);
      comm_.allgather(chunk.data(), s.gathered, bucket.chunk, group());
    } else {
      comm_.allgather(value_shard_.data() + bucket.shard_offset, s.gathered, bucket.chunk, group());
    }
  }
  store_->attach_values(b, s.gathered);
  if (next != kNone && ahead_.bucket == kNone && next != b && !store_->values_attached(next)) start_ahead(next);
  counts_.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void Sharding::start_ahead(std::size_t b) {
  const nn::Bucket& bucket = store_->buckets()[b];
  ahead_.bucket = b;
  ahead_.buffer = gather_buffers_.take(bucket.length);
  if (!value_file_) {
    ahead_.op = comm_.iallgather(value_shard_.data() + bucket.shard_offset, ahead_.buffer, bucket.chunk, group());
    return;
  }
  // This rank's chunk read into its place in the bucket (the whole bucket, alone in the group).
  if (!value_io_) value_io_ = std::make_unique<StateIo>(*value_file_);
  ahead_.read_before = value_file_->bytes_read();
  ahead_.read_settled = false;
  ahead_.ticket = value_io_->read_range(0, bucket.shard_offset, bucket.chunk,
                                        ahead_.buffer + static_cast<std::size_t>(rank_) * bucket.chunk,
                                        ahead_bounce_.get(), kBounce);
}

void Sharding::settle_read() const {
  if (ahead_.read_settled) return;
  try {
    value_io_->wait(ahead_.ticket);
  } catch (const std::exception&) {
    // kept by the queue: finish_ahead() rethrows it where the bucket is used
  }
  gather_read_ += value_file_->bytes_read() - ahead_.read_before;
  ahead_.read_settled = true;
}

void Sharding::finish_ahead() {
  const nn::Bucket& bucket = store_->buckets()[ahead_.bucket];
  float* gathered = ahead_.buffer;
  if (!value_file_) {
    ahead_.op.wait();
  } else {
    settle_read();
    if (shards_ == 1) {
      value_io_->wait(ahead_.ticket);  // rethrows a failed read
    } else {
      // As gather()'s: a read that failed on one rank stops every rank of the group here.
      agree(comm_.handle(group()), [&] { value_io_->wait(ahead_.ticket); });
      comm_.allgather(gathered + static_cast<std::size_t>(rank_) * bucket.chunk, gathered, bucket.chunk, group());
    }
  }
  buckets_[ahead_.bucket].gathered = gathered;
  ahead_ = Ahead{};
}

void Sharding::drop_ahead() {
  if (ahead_.bucket == kNone) return;
  settle_read();
  if (ahead_.op.done() == false) ahead_.op.wait();
  gather_buffers_.give(ahead_.buffer);
  ahead_ = Ahead{};
  ++counts_.dropped;
}

void Sharding::progress() {
  if (ahead_.bucket != kNone && !value_file_) ahead_.op.test();
}

void Sharding::before_update() {
  drop_ahead();
  update_at_ = order_.size();
}

void Sharding::release(const ExecSpace& exec, std::size_t b) {
  if (!values_sharded_) return;
  exec.fence();  // kernels reading the values are done
  store_->attach_values(b, nullptr);
  if (buckets_[b].gathered != nullptr) gather_buffers_.give(buckets_[b].gathered);
  buckets_[b].gathered = nullptr;
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
