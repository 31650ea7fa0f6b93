#pragma once
// Element-wise copy with a type conversion (uint8 pixels to float inputs, double to float
// checkpoints, labels to int32).
#include "kernels/views.hpp"

namespace tessera::kernels {

/// \brief y_i = Out(x_i * scale + offset).  x (n), y (n).
template <class XView, class YView>
void convert(const ExecSpace& exec, const XView& x, const YView& y, double scale = 1.0,
             double offset = 0.0) {
  using Out = typename YView::non_const_value_type;
  Kokkos::parallel_for("tessera::convert", range(exec, Index(x.extent(0))),
                       KOKKOS_LAMBDA(const Index i) { y(i) = Out(double(x(i)) * scale + offset); });
}

}  // namespace tessera::kernels
