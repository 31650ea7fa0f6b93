#include "nn/param_store.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <stdexcept>
#include <type_traits>

#include "core/memory.hpp"
#include "kernels/precision.hpp"
#include "kernels/random.hpp"

namespace tessera::nn {

namespace {
std::size_t round_up(std::size_t n, std::size_t m) { return (n + m - 1) / m * m; }
}  // namespace

template <class T>
void ParamStore<T>::begin_unit(bool solo) {
  if (planned_) throw std::logic_error("tessera::ParamStore::begin_unit() after plan()");
  // A unit without parameters is no unit: only a started one ends.
  if (!infos_.empty() && infos_.back().unit + 1 == units_) ++units_;
  solo_.resize(units_, false);
  solo_[units_ - 1] = solo;
}

template <class T>
void ParamStore<T>::begin_bucket() {
  begin_unit();
  bucket_start_.resize(units_, false);
  bucket_start_[units_ - 1] = true;
}

template <class T>
std::size_t ParamStore<T>::add(const std::string& name, std::vector<std::int64_t> shape,
                               InitKind init, double bound, Placement placement) {
  if (planned_) throw std::logic_error(fmt::format("tessera::ParamStore::add('{}') after plan()", name));
  if (index_.count(name))
    throw std::logic_error(fmt::format("tessera::ParamStore::add: parameter '{}' exists", name));
  std::size_t size = 1;
  for (const std::int64_t extent : shape) {
    if (extent < 0)
      throw std::invalid_argument(fmt::format("tessera::ParamStore::add: parameter '{}' has a "
                                              "negative extent {}", name, extent));
    size *= static_cast<std::size_t>(extent);
  }
  ParamInfo info;
  info.name = name;
  info.logical_shape = placement.logical_shape.empty() ? shape : placement.logical_shape;
  info.block_offset = placement.offset.empty() ? std::vector<std::int64_t>(shape.size(), 0) : placement.offset;
  info.tensor_sharded = placement.tensor_sharded;
  info.tie = placement.tie;
  bool fits = info.logical_shape.size() == shape.size() && info.block_offset.size() == shape.size() &&
              shape.size() <= 4;
  for (std::size_t d = 0; fits && d < shape.size(); ++d)
    fits = info.block_offset[d] >= 0 && info.block_offset[d] + shape[d] <= info.logical_shape[d];
  if (!fits && !(placement.logical_shape.empty() && placement.offset.empty()))
    throw std::invalid_argument(fmt::format("tessera::ParamStore::add: parameter '{}': its block does "
                                            "not fit its logical shape (blocks of 1 to 4 dimensions)", name));
  info.shape = std::move(shape);
  info.size = size;
  info.unit = units_ - 1;
  info.init = init;
  info.bound = bound;
  index_.emplace(info.name, infos_.size());
  infos_.push_back(std::move(info));
  return infos_.size() - 1;
}

template <class T>
void ParamStore<T>::plan(int shards, std::size_t bucket_elements) {
  if (planned_) throw std::logic_error("tessera::ParamStore::plan() called twice");
  if (shards < 1) throw std::invalid_argument("tessera::ParamStore::plan: shards must be >= 1");
  shards_ = shards;
  units_ = infos_.empty() ? 0 : infos_.back().unit + 1;  // a trailing begin_unit() adds none
  // Units' aligned sizes, then buckets filled from the last unit backwards.
  std::vector<std::size_t> unit_size(units_, 0), unit_first(units_, infos_.size()), unit_end(units_, 0);
  for (std::size_t i = 0; i < infos_.size(); ++i) {
    const std::size_t u = infos_[i].unit;
    unit_size[u] += round_up(infos_[i].size, alignment);
    unit_first[u] = std::min(unit_first[u], i);
    unit_end[u] = std::max(unit_end[u], i + 1);
  }
  std::vector<std::pair<std::size_t, std::size_t>> ranges;  // [first_unit, last_unit], backwards
  solo_.resize(units_, false);
  bucket_start_.resize(units_, false);
  std::size_t open_last = units_ - 1, filled = 0;
  for (std::size_t u = units_; u-- > 0;) {
    if (solo_[u] && filled > 0) {  // close the bucket after the solo unit
      ranges.emplace_back(u + 1, open_last);
      filled = 0;
      open_last = u;
    }
    filled += unit_size[u];
    if (filled >= bucket_elements || u == 0 || solo_[u] || solo_[u - 1] || bucket_start_[u]) {
      ranges.emplace_back(u, open_last);
      filled = 0;
      open_last = u - 1;
    }
  }
  std::reverse(ranges.begin(), ranges.end());

  buckets_.clear();
  unit_bucket_.assign(units_, 0);
  size_ = 0;
  std::size_t shard_offset = 0;
  for (const auto& [first, last] : ranges) {
    Bucket b;
    b.offset = size_;
    b.first_unit = first;
    b.last_unit = last;
    b.first_param = unit_first[first];
    b.end_param = unit_end[last];
    std::size_t at = b.offset;
    for (std::size_t i = b.first_param; i < b.end_param; ++i) {
      infos_[i].offset = at;
      infos_[i].bucket = buckets_.size();
      at += round_up(infos_[i].size, alignment);
    }
    b.length = round_up(at - b.offset, alignment * static_cast<std::size_t>(shards));
    b.chunk = b.length / static_cast<std::size_t>(shards);
    b.shard_offset = shard_offset;
    shard_offset += b.chunk;
    for (std::size_t u = first; u <= last; ++u) unit_bucket_[u] = buckets_.size();
    size_ += b.length;
    buckets_.push_back(b);
  }
  planned_ = true;
}

template <class T>
void ParamStore<T>::allocate(Storage storage) {
  if (allocated_) throw std::logic_error("tessera::ParamStore::allocate() called twice");
  if (!planned_) plan(1);
  storage_ = storage;
  value_base_.assign(buckets_.size(), nullptr);
  grad_base_.assign(buckets_.size(), nullptr);
  if (storage.full_values) {
    values_ = Vector<T>(mem::label(mem::Category::param, "tessera::ParamStore::values"), size_);
    for (std::size_t b = 0; b < buckets_.size(); ++b) value_base_[b] = values_.data() + buckets_[b].offset;
  }
  if (storage.full_grads) {
    grads_ = Vector<T>(mem::label(mem::Category::grad, "tessera::ParamStore::grads"), size_);
    for (std::size_t b = 0; b < buckets_.size(); ++b) grad_base_[b] = grads_.data() + buckets_[b].offset;
  }
  allocated_ = true;
}

template <class T>
void ParamStore<T>::initialize_range(const ExecSpace& exec, std::uint64_t seed, std::size_t begin,
                                     std::size_t end, T* out) const {
  Kokkos::deep_copy(exec, VectorU<T>(out, end - begin), T(0));
  for (const auto& info : infos_) {
    const std::size_t lo = std::max(begin, info.offset), hi = std::min(end, info.offset + info.size);
    if (lo >= hi) continue;
    const VectorU<T> v(out + (lo - begin), hi - lo);
    const std::uint64_t first = lo - info.offset;  // local index of v(0)
    const std::uint64_t stream = kernels::hash_name(info.name);
    const double bound = info.bound;
    // Local index k of the block -> its multi-index (row-major over shape) -> plus the block's
    // offset -> the logical row-major index. Up to 4 dimensions.
    if (info.shape.size() > 4)
      throw std::logic_error(fmt::format("tessera::ParamStore: parameter '{}' has more than 4 dimensions", info.name));
    Kokkos::Array<std::uint64_t, 4> dims{1, 1, 1, 1}, logical_dims{1, 1, 1, 1}, offset{0, 0, 0, 0};
    const std::size_t pad = 4 - info.shape.size();
    for (std::size_t d = 0; d < info.shape.size(); ++d) {
      dims[pad + d] = std::uint64_t(info.shape[d]);
      logical_dims[pad + d] = std::uint64_t(info.logical_shape[d]);
      offset[pad + d] = info.block_offset.empty() ? 0 : std::uint64_t(info.block_offset[d]);
    }
    const auto to_logical = [=] KOKKOS_FUNCTION(std::uint64_t k) {
      std::uint64_t logical = 0, rest = k, stride = 1;
      Kokkos::Array<std::uint64_t, 4> idx{};
      for (int d = 3; d >= 0; --d) {
        idx[d] = rest % dims[d];
        rest /= dims[d];
      }
      for (int d = 3; d >= 0; --d) {
        logical += (idx[d] + offset[d]) * stride;
        stride *= logical_dims[d];
      }
      return logical;
    };
    const char* label = "tessera::ParamStore::initialize";
    switch (info.init) {
      case InitKind::uniform:
        Kokkos::parallel_for(label, range(exec, Index(hi - lo)), KOKKOS_LAMBDA(const Index j) {
          const std::uint64_t k = first + std::uint64_t(j);
          const std::uint64_t logical = to_logical(k);
          v(j) = T(bound * (2.0 * kernels::uniform01(seed, stream, logical) - 1.0));
        });
        break;
      case InitKind::normal:
        Kokkos::parallel_for(label, range(exec, Index(hi - lo)), KOKKOS_LAMBDA(const Index j) {
          const std::uint64_t k = first + std::uint64_t(j);
          const std::uint64_t logical = to_logical(k);
          v(j) = T(bound * kernels::normal(seed, stream, logical));
        });
        break;
      case InitKind::zeros:
        break;
      case InitKind::ones:
        Kokkos::deep_copy(exec, v, T(1));
        break;
    }
  }
}

template <class T>
void ParamStore<T>::initialize(const ExecSpace& exec, std::uint64_t seed) {
  if (!allocated_ || !storage_.full_values)
    throw std::logic_error("tessera::ParamStore::initialize() needs allocated full values");
  initialize_range(exec, seed, 0, size_, values_.data());
  values_changed();
}

template <class T>
void ParamStore<T>::zero_grads(const ExecSpace& exec) {
  if (!storage_.full_grads) throw std::logic_error("tessera::ParamStore::zero_grads() without full gradients");
  Kokkos::deep_copy(exec, grads_, T(0));
}

template <class T>
std::size_t ParamStore<T>::find(const std::string& name) const {
  if (const auto i = index_of(name)) return *i;
  throw std::out_of_range(fmt::format("tessera::ParamStore: no parameter named '{}'", name));
}

template <class T>
std::optional<std::size_t> ParamStore<T>::index_of(const std::string& name) const {
  const auto it = index_.find(name);
  return it == index_.end() ? std::nullopt : std::optional<std::size_t>(it->second);
}

template <class T>
std::size_t ParamStore<T>::parameter_count() const {
  std::size_t count = 0;
  for (const auto& info : infos_) count += info.size;
  return count;
}

template <class T>
void ParamStore<T>::attach_values(std::size_t b, T* base) {
  if (storage_.full_values) throw std::logic_error("tessera::ParamStore::attach_values with full values");
  value_base_.at(b) = base;
  values_changed();
}

template <class T>
const std::uint16_t* ParamStore<T>::bf16_value(const ExecSpace& exec, std::size_t i) {
  if constexpr (!std::is_same_v<T, float>) {
    throw std::logic_error("tessera::ParamStore::bf16_value of a store that does not hold floats");
  } else {
    const ParamInfo& info = at(i);
    if (bf16_values_.data() == nullptr) {
      bf16_values_ = Vector<std::uint16_t>(
          Kokkos::view_alloc(mem::label(mem::Category::param, "tessera::ParamStore::bf16 copies"),
                             Kokkos::WithoutInitializing),
          size_);
      bf16_made_.assign(infos_.size(), 0);
    }
    std::uint16_t* out = bf16_values_.data() + info.offset;
    if (bf16_made_[i] != values_version_) {
      const float* in = value_ptr(i);
      Kokkos::parallel_for(
          "tessera::ParamStore::bf16_value", range(exec, Index(info.size)),
          KOKKOS_LAMBDA(const Index j) { out[j] = kernels::to_bf16_bits(in[j]); });
      bf16_made_[i] = values_version_;
    }
    return out;
  }
}

template <class T>
VectorU<std::uint16_t> ParamStore<T>::bf16_copies() const {
  if (bf16_values_.data() == nullptr) return {};
  return VectorU<std::uint16_t>(bf16_values_.data(), size_);
}

template <class T>
void ParamStore<T>::bf16_copies_written() {
  if (bf16_values_.data() == nullptr) throw std::logic_error("tessera::ParamStore::bf16_copies_written without copies");
  bf16_made_.assign(infos_.size(), values_version_);
}

template <class T>
void ParamStore<T>::attach_grads(std::size_t b, T* base) {
  if (storage_.full_grads) throw std::logic_error("tessera::ParamStore::attach_grads with full gradients");
  grad_base_.at(b) = base;
}

template <class T>
const ParamInfo& ParamStore<T>::at(std::size_t i) const {
  if (!allocated_) throw std::logic_error("tessera::ParamStore: views requested before allocate()");
  return infos_.at(i);
}

template <class T>
T* ParamStore<T>::locate(const std::vector<T*>& bases, std::size_t i, const char* what) const {
  const ParamInfo& info = at(i);
  T* base = bases[info.bucket];
  if (base == nullptr)
    throw std::logic_error(fmt::format("tessera::ParamStore: {} of '{}' requested while its bucket "
                                       "has none attached", what, info.name));
  return base + (info.offset - buckets_[info.bucket].offset);
}

template <class T>
MatrixU<T> ParamStore<T>::matrix(T* data, std::size_t i) const {
  const ParamInfo& info = at(i);
  if (info.shape.size() < 2)
    throw std::logic_error(fmt::format("tessera::ParamStore: parameter '{}' has {} dimensions, not 2 or more",
                                       info.name, info.shape.size()));
  // Leading dimensions fold into the rows ([groups, rows, cols] is a (groups*rows, cols) matrix).
  const std::size_t cols = static_cast<std::size_t>(info.shape.back());
  return MatrixU<T>(data, info.size / cols, cols);
}

template class ParamStore<float>;
template class ParamStore<double>;

}  // namespace tessera::nn
