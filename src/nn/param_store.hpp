#pragma once
// Every parameter of a model in flat buffers of values and of gradients, so that a gradient
// exchange is one call per bucket and the optimizer one kernel. Parameters are registered by name
// (layers.0.weight) before allocate(), grouped into units (one layer each: what ZeRO-3 gathers
// and what backward finishes at once); each gets an offset padded to 16 elements (the padding stays
// zero in values and gradients).
//
// Buckets: plan() groups consecutive units, filled from the last unit backwards (the order
// backward finishes them), into buckets of about bucket_elements each. A bucket is a contiguous
// range of the flat layout whose length is a multiple of 16 * shards, so a ZeRO data rank r owns
// the r-th equal chunk of every bucket; a rank's shard is its chunks one after another.
//
// Storage: by default both flat buffers are allocated (full_values, full_grads). A ZeRO stage may
// leave either out and attach a bucket's memory only while it is needed (attach_values /
// attach_grads); views of a detached bucket's parameters throw std::logic_error.
//
// Initial values follow DESIGN.md's invariant: logical element j of parameter `name` is a pure
// function of (seed, hash_name(name), j), whatever else the store holds, whatever the rank count,
// tensor block and shard.
#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "kernels/views.hpp"

namespace tessera::nn {

enum class InitKind { uniform, normal, zeros, ones };

/// A parameter used by two pipeline stages (a language model's embedding and its tied head):
/// the first stage holds the original, the last a copy kept equal by summing both gradients
/// before the update. Checkpoints and the gradient norm see the original only.
enum class Tie { none, original, copy };

/// Where a parameter's local block sits in its logical tensor (tensor parallelism holds a block
/// of rows or of columns on each tensor rank).
struct Placement {
  std::vector<std::int64_t> logical_shape;  ///< empty: the local shape (the whole tensor)
  std::vector<std::int64_t> offset;         ///< the block's first logical index per dimension
  bool tensor_sharded = false;              ///< false: every tensor rank holds the same values
  Tie tie = Tie::none;
};

struct ParamInfo {
  std::string name;                 ///< stable, layout-free: "layers.0.weight"
  std::vector<std::int64_t> shape;  ///< this rank's block, row-major ([out, in] for a weight)
  std::vector<std::int64_t> logical_shape;  ///< the whole tensor's shape (checkpoints hold it)
  std::vector<std::int64_t> block_offset;   ///< where the block starts in it, per dimension
  bool tensor_sharded = false;      ///< distinct blocks on the tensor ranks (else replicated)
  Tie tie = Tie::none;              ///< a tied parameter's original or its other stage's copy
  std::size_t offset = 0;           ///< first element in the flat buffers (set by plan())
  std::size_t size = 0;             ///< product of shape
  std::size_t unit = 0;             ///< the unit (layer) it belongs to
  std::size_t bucket = 0;           ///< the bucket it belongs to (set by plan())
  InitKind init = InitKind::zeros;
  double bound = 0.0;               ///< uniform: U(-bound, bound); normal: N(0, bound^2)
};

/// A contiguous range of the flat layout holding whole units.
struct Bucket {
  std::size_t offset = 0;        ///< first element in the flat layout
  std::size_t length = 0;        ///< elements, padding included: a multiple of 16 * shards
  std::size_t first_param = 0;   ///< parameters [first_param, end_param)
  std::size_t end_param = 0;
  std::size_t first_unit = 0;    ///< units [first_unit, last_unit]
  std::size_t last_unit = 0;
  std::size_t chunk = 0;         ///< length / shards: what each shard owns of it
  std::size_t shard_offset = 0;  ///< where that chunk starts in a shard
};

/// Which flat buffers allocate() creates.
struct Storage {
  bool full_values = true;
  bool full_grads = true;
};

template <class T>
class ParamStore {
 public:
  /// Offsets are multiples of this many elements.
  static constexpr std::size_t alignment = 16;

  /// \brief Starts a new unit; parameters added from now on belong to it. Before the first call
  /// every parameter belongs to unit 0. A solo unit gets a bucket of its own (a tied parameter,
  /// whose bucket must be laid out alike on the two stages that hold it).
  void begin_unit(bool solo = false);

  /// \brief Starts a new unit that also starts a new bucket: no bucket holds units from both
  /// sides of this point (a pipeline stage's interleaved chunks, whose backwards run apart).
  void begin_bucket();

  /// \brief Registers a parameter; returns its index. Throws std::logic_error after plan() or
  /// allocate(), or for a repeated name, std::invalid_argument for a negative extent.
  std::size_t add(const std::string& name, std::vector<std::int64_t> shape, InitKind init,
                  double bound = 0.0, Placement placement = {});

  /// \brief Fixes the layout: buckets of about bucket_elements (at least one unit each) and
  /// bucket lengths divisible into `shards` equal chunks. Optional; allocate() plans one bucket
  /// and one shard when it was not called.
  void plan(int shards, std::size_t bucket_elements = std::numeric_limits<std::size_t>::max());

  /// \brief Allocates the flat buffers the storage asks for (zero-filled). Call once.
  void allocate(Storage storage = {});
  bool allocated() const { return allocated_; }
  const Storage& storage() const { return storage_; }

  /// \brief Fills every parameter from its (seed, name) stream; padding stays zero. Needs full values.
  void initialize(const ExecSpace& exec, std::uint64_t seed);
  /// \brief Fills out[0, end-begin) with flat elements [begin, end) as initialize() would.
  void initialize_range(const ExecSpace& exec, std::uint64_t seed, std::size_t begin,
                        std::size_t end, T* out) const;
  /// \brief Sets every gradient (and the padding) to zero. Needs full gradients.
  void zero_grads(const ExecSpace& exec);

  /// Index of the parameter called `name`; throws std::out_of_range when there is none.
  std::size_t find(const std::string& name) const;
  /// \brief The index of the parameter `name`, or nullopt where this store has none of that name.
  std::optional<std::size_t> index_of(const std::string& name) const;

  /// Parameter i's values (size), its gradient, and both as a matrix (2-D parameters only).
  VectorU<T> value(std::size_t i) const { return VectorU<T>(value_ptr(i), at(i).size); }
  VectorU<T> grad(std::size_t i) const { return VectorU<T>(grad_ptr(i), at(i).size); }
  MatrixU<T> value_matrix(std::size_t i) const { return matrix(value_ptr(i), i); }
  MatrixU<T> grad_matrix(std::size_t i) const { return matrix(grad_ptr(i), i); }

  /// The whole flat buffers (padding included): size() elements; empty when not allocated.
  Vector<T> values() const { return values_; }
  Vector<T> grads() const { return grads_; }
  const std::vector<ParamInfo>& infos() const { return infos_; }
  const std::vector<Bucket>& buckets() const { return buckets_; }
  /// The bucket holding unit u.
  std::size_t bucket_of_unit(std::size_t u) const { return unit_bucket_.at(u); }
  std::size_t units() const { return units_; }
  int shards() const { return shards_; }
  /// Elements of one rank's shard: the sum of every bucket's chunk.
  std::size_t shard_size() const { return size_ / static_cast<std::size_t>(shards_); }
  /// Elements in each flat buffer, padding included.
  std::size_t size() const { return size_; }
  /// Elements of all parameters, padding excluded (what a user calls the parameter count).
  std::size_t parameter_count() const;

  /// \brief Says that the values changed (an optimizer update, a checkpoint read): every bf16
  /// copy (bf16_value) is made anew at its next use. initialize() and attach_values() say it
  /// themselves; whoever else writes values must call it.
  void values_changed() { ++values_version_; }
  std::uint64_t values_version() const { return values_version_; }

  /// \brief Parameter i's values rounded to bf16 (bit patterns, kernels/precision.hpp; laid out
  /// as the values): a copy made on exec at the first call after the values changed and kept
  /// until they change again, so every product of a step (forward, backward, recompute, every
  /// micro-batch) reads one copy instead of converting the fp32 weight at each call. The copies
  /// of all parameters take 2 bytes an element (counted as parameter memory), allocated at the
  /// first call. Float stores only (std::logic_error otherwise).
  const std::uint16_t* bf16_value(const ExecSpace& exec, std::size_t i);
  /// \brief For an update that writes every parameter's bf16 copy in the pass that writes its
  /// values (kernels::UpdateExtras): the copies' whole buffer, laid out as values() (size()
  /// elements), or an empty view where no copy was asked for yet (a model without bf16 products
  /// never has them). After writing it, call values_changed() and then bf16_copies_written().
  VectorU<std::uint16_t> bf16_copies() const;
  /// \brief Says that bf16_copies() holds every parameter's current values rounded to bf16.
  void bf16_copies_written();

  /// \brief Points bucket b's values (or gradients) at `base` (bucket.length elements), or
  /// detaches them with nullptr. Only where the storage leaves that buffer out.
  void attach_values(std::size_t b, T* base);
  void attach_grads(std::size_t b, T* base);
  bool values_attached(std::size_t b) const { return value_base_.at(b) != nullptr; }
  bool grads_attached(std::size_t b) const { return grad_base_.at(b) != nullptr; }

 private:
  const ParamInfo& at(std::size_t i) const;
  T* value_ptr(std::size_t i) const { return locate(value_base_, i, "values"); }
  T* grad_ptr(std::size_t i) const { return locate(grad_base_, i, "gradient"); }
  T* locate(const std::vector<T*>& bases, std::size_t i, const char* what) const;
  MatrixU<T> matrix(T* data, std::size_t i) const;

  std::vector<ParamInfo> infos_;
  std::unordered_map<std::string, std::size_t> index_;  // name -> position in infos_
  std::vector<Bucket> buckets_;
  std::vector<std::size_t> unit_bucket_;
  std::vector<bool> solo_;  // per unit begun: solo or not
  std::vector<bool> bucket_start_;  // per unit begun: begin_bucket() started it
  std::size_t units_ = 1;
  int shards_ = 1;
  std::size_t size_ = 0;
  bool planned_ = false, allocated_ = false;
  Storage storage_;
  Vector<T> values_;
  Vector<T> grads_;
  std::vector<T*> value_base_, grad_base_;  // per bucket: where its first element lives
  std::uint64_t values_version_ = 1;
  Vector<std::uint16_t> bf16_values_;       // bf16 copies (bf16_value), allocated at first use
  std::vector<std::uint64_t> bf16_made_;    // per parameter: the values_version_ of its copy
};

extern template class ParamStore<float>;
extern template class ParamStore<double>;

}  // namespace tessera::nn
