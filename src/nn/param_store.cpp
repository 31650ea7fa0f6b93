#include "nn/param_store.hpp"

#include <stdexcept>

#include "kernels/random.hpp"

namespace tessera::nn {

template <class T>
std::size_t ParamStore<T>::add(const std::string& name, std::vector<std::int64_t> shape,
                               InitKind init, double bound) {
  if (allocated_) {
    throw std::logic_error("tessera::ParamStore::add('" + name + "') after allocate()");
  }
  for (const auto& info : infos_) {
    if (info.name == name) {
      throw std::logic_error("tessera::ParamStore::add: parameter '" + name + "' exists");
    }
  }
  std::size_t size = 1;
  for (const std::int64_t extent : shape) {
    if (extent < 0) {
      throw std::invalid_argument("tessera::ParamStore::add: parameter '" + name +
                                  "' has a negative extent " + std::to_string(extent));
    }
    size *= static_cast<std::size_t>(extent);
  }
  ParamInfo info;
  info.name = name;
  info.shape = std::move(shape);
  info.offset = size_;
  info.size = size;
  info.init = init;
  info.bound = bound;
  infos_.push_back(std::move(info));
  size_ += (size + alignment - 1) / alignment * alignment;
  return infos_.size() - 1;
}

template <class T>
void ParamStore<T>::allocate() {
  if (allocated_) throw std::logic_error("tessera::ParamStore::allocate() called twice");
  values_ = Vector<T>("tessera::ParamStore::values", size_);
  grads_ = Vector<T>("tessera::ParamStore::grads", size_);
  allocated_ = true;
}

template <class T>
void ParamStore<T>::initialize(const ExecSpace& exec, std::uint64_t seed) {
  if (!allocated_) throw std::logic_error("tessera::ParamStore::initialize() before allocate()");
  for (const auto& info : infos_) {
    const VectorU<T> v(values_.data() + info.offset, info.size);
    const std::uint64_t stream = kernels::hash_name(info.name);
    const double bound = info.bound;
    const std::string label = "tessera::ParamStore::initialize";
    switch (info.init) {
      case InitKind::uniform:
        Kokkos::parallel_for(label, range(exec, Index(info.size)), KOKKOS_LAMBDA(const Index j) {
          v(j) = T(bound * (2.0 * kernels::uniform01(seed, stream, std::uint64_t(j)) - 1.0));
        });
        break;
      case InitKind::normal:
        Kokkos::parallel_for(label, range(exec, Index(info.size)), KOKKOS_LAMBDA(const Index j) {
          v(j) = T(bound * kernels::normal(seed, stream, std::uint64_t(j)));
        });
        break;
      case InitKind::zeros:
        Kokkos::deep_copy(exec, v, T(0));
        break;
      case InitKind::ones:
        Kokkos::deep_copy(exec, v, T(1));
        break;
    }
  }
}

template <class T>
void ParamStore<T>::zero_grads(const ExecSpace& exec) {
  Kokkos::deep_copy(exec, grads_, T(0));
}

template <class T>
std::size_t ParamStore<T>::find(const std::string& name) const {
  for (std::size_t i = 0; i < infos_.size(); ++i) {
    if (infos_[i].name == name) return i;
  }
  throw std::out_of_range("tessera::ParamStore: no parameter named '" + name + "'");
}

template <class T>
std::size_t ParamStore<T>::parameter_count() const {
  std::size_t count = 0;
  for (const auto& info : infos_) count += info.size;
  return count;
}

template <class T>
const ParamInfo& ParamStore<T>::at(std::size_t i) const {
  if (!allocated_) throw std::logic_error("tessera::ParamStore: views requested before allocate()");
  return infos_.at(i);
}

template <class T>
MatrixU<T> ParamStore<T>::matrix(const Vector<T>& buffer, std::size_t i) const {
  const ParamInfo& info = at(i);
  if (info.shape.size() != 2) {
    throw std::logic_error("tessera::ParamStore: parameter '" + info.name + "' has " +
                           std::to_string(info.shape.size()) + " dimensions, not 2");
  }
  return MatrixU<T>(buffer.data() + info.offset, info.shape[0], info.shape[1]);
}

template class ParamStore<float>;
template class ParamStore<double>;

}  // namespace tessera::nn
