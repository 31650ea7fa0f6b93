#pragma once
// Every parameter of a model in one flat buffer of values and one of gradients, so that the
// gradient allreduce is one call and the optimizer one kernel. Parameters are registered by
// name (layers.0.weight) before allocate(); each gets an offset padded to 16 elements (the
// padding stays zero in values and gradients).
//
// Initial values follow DESIGN.md's invariant: element j of parameter `name` is a pure function
// of (seed, hash_name(name), j), whatever else the store holds and whatever the rank count.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/views.hpp"

namespace tessera::nn {

enum class InitKind { uniform, normal, zeros, ones };

struct ParamInfo {
  std::string name;                 ///< stable, layout-free: "layers.0.weight"
  std::vector<std::int64_t> shape;  ///< logical shape, row-major ([out, in] for a weight)
  std::size_t offset = 0;           ///< first element in the flat buffers
  std::size_t size = 0;             ///< product of shape
  InitKind init = InitKind::zeros;
  double bound = 0.0;               ///< uniform: U(-bound, bound); normal: N(0, bound^2)
};

template <class T>
class ParamStore {
 public:
  /// Offsets are multiples of this many elements.
  static constexpr std::size_t alignment = 16;

  /// \brief Registers a parameter; returns its index. Throws std::logic_error after allocate()
  /// or for a repeated name, std::invalid_argument for a negative extent.
  std::size_t add(const std::string& name, std::vector<std::int64_t> shape, InitKind init,
                  double bound = 0.0);

  /// \brief Allocates the value and gradient buffers (zero-filled). Call once, after every add().
  void allocate();
  bool allocated() const { return allocated_; }

  /// \brief Fills every parameter from its (seed, name) stream; padding stays zero.
  void initialize(const ExecSpace& exec, std::uint64_t seed);
  /// \brief Sets every gradient (and the padding) to zero.
  void zero_grads(const ExecSpace& exec);

  /// Index of the parameter called `name`; throws std::out_of_range when there is none.
  std::size_t find(const std::string& name) const;

  /// Parameter i's values (size), its gradient, and both as a matrix (2-D parameters only).
  VectorU<T> value(std::size_t i) const { return VectorU<T>(values_.data() + at(i).offset, at(i).size); }
  VectorU<T> grad(std::size_t i) const { return VectorU<T>(grads_.data() + at(i).offset, at(i).size); }
  MatrixU<T> value_matrix(std::size_t i) const { return matrix(values_, i); }
  MatrixU<T> grad_matrix(std::size_t i) const { return matrix(grads_, i); }

  /// The whole flat buffers (padding included): size() elements.
  Vector<T> values() const { return values_; }
  Vector<T> grads() const { return grads_; }
  const std::vector<ParamInfo>& infos() const { return infos_; }
  /// Elements in each flat buffer, padding included.
  std::size_t size() const { return size_; }
  /// Elements of all parameters, padding excluded (what a user calls the parameter count).
  std::size_t parameter_count() const;

 private:
  const ParamInfo& at(std::size_t i) const;
  MatrixU<T> matrix(const Vector<T>& buffer, std::size_t i) const;

  std::vector<ParamInfo> infos_;
  std::size_t size_ = 0;
  bool allocated_ = false;
  Vector<T> values_;
  Vector<T> grads_;
};

extern template class ParamStore<float>;
extern template class ParamStore<double>;

}  // namespace tessera::nn
