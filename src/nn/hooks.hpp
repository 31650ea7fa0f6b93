#pragma once
// What a model tells the parallel runtime as it goes through its units (layers): before a unit
// reads its parameters (ZeRO-3 gathers them), after it is done with them (and may release them),
// and when backward has finished a unit's gradients (so a bucket's exchange may start while
// backward goes on with earlier units). Units are those of the model's ParamStore.
#include <cstddef>

namespace tessera::nn {

class LayerHooks {
 public:
  virtual ~LayerHooks() = default;
  virtual void before_forward(std::size_t /*unit*/) {}
  virtual void after_forward(std::size_t /*unit*/) {}
  virtual void before_backward(std::size_t /*unit*/) {}
  /// The unit's parameter gradients for this micro-batch are complete.
  virtual void after_backward(std::size_t /*unit*/) {}
};

}  // namespace tessera::nn
