#pragma once
// RMSNorm over the last dimension of a row-major (rows, C) matrix with an affine weight and no
// bias, as Hugging Face's LlamaRMSNorm(C, eps):
//   rstd_r = 1 / sqrt((1/C) sum_c x_rc^2 + eps),   n_rc = x_rc rstd_r,   y_rc = n_rc weight_c
// Saved for backward: rstd (rows); backward also reads x and weight again. With g_rc = dy_rc weight_c:
//   dx_rc      = rstd_r (g_rc - n_rc mean_c(g_r. n_r.))        (overwritten; + a residual)
//   dweight_c += sum_r dy_rc n_rc                             (accumulated)
#include "kernels/layernorm.hpp"
#include "kernels/math.hpp"
#include "kernels/precision.hpp"
#include "kernels/simd.hpp"
#include "kernels/views.hpp"

namespace tessera::kernels {

/// \brief y = x rstd weight, saving rstd. x (rows,C), weight (C), y (rows,C) (fp32, or a bf16
/// buffer that gets the values rounded once), rstd (rows). One thread per row.
template <class XView, class WView, class YView, class RView>
void rmsnorm_forward(const ExecSpace& exec, const XView& x, const WView& weight, const YView& y, const RView& rstd,
                     double eps) {
  using T = typename RView::non_const_value_type;
  const Index cols = Index(x.extent(1));
  const T eps_t = T(eps);
  Kokkos::parallel_for(
      "tessera::rmsnorm_forward", range(exec, Index(x.extent(0))), KOKKOS_LAMBDA(const Index r) {
        T sum = T(0);
        TESSERA_SIMD_REDUCTION(+ : sum)
        for (Index c = 0; c < cols; ++c) sum += T(x(r, c)) * T(x(r, c));
        const T s = T(1) / math::sqrt(sum / T(cols) + eps_t);
        rstd(r) = s;
        TESSERA_SIMD
        for (Index c = 0; c < cols; ++c) stored(y(r, c)) = T(x(r, c)) * s * T(weight(c));
      });
}

/// \brief Gradients of rmsnorm_forward: dx = the input gradient + residual (overwritten; may
/// alias dy or residual), dweight accumulated (+=). x (rows,C), weight (C), rstd (rows) as saved,
/// dy (rows,C) (fp32, or bf16 read as its values), residual (rows,C) or NoResidual. dweight: one
/// thread per block of columns looping over the rows (fixed order), before dx.
template <class XView, class WView, class RView, class DyView, class DxView, class DwView,
          class ResView = NoResidual>
void rmsnorm_backward(const ExecSpace& exec, const XView& x, const WView& weight, const RView& rstd,
                      const DyView& dy, const DxView& dx, const DwView& dweight, const ResView& residual = {}) {
  using T = typename DxView::non_const_value_type;
  const Index rows = Index(x.extent(0)), cols = Index(x.extent(1));
  const Index width = column_block(exec, cols);
  Kokkos::parallel_for(
      "tessera::rmsnorm_backward::weight", range(exec, (cols + width - 1) / width), KOKKOS_LAMBDA(const Index block) {
        const Index c0 = block * width;
        const Index n = cols - c0 < width ? cols - c0 : width;
        T sum_w[column_block_max] = {};
        for (Index r = 0; r < rows; ++r) {
          const T s = rstd(r);
          TESSERA_SIMD
          for (Index k = 0; k < n; ++k) sum_w[k] += T(loaded(dy(r, c0 + k))) * T(x(r, c0 + k)) * s;
        }
        for (Index k = 0; k < n; ++k) dweight(c0 + k) += sum_w[k];
      });
  Kokkos::parallel_for(
      "tessera::rmsnorm_backward::dx", range(exec, rows), KOKKOS_LAMBDA(const Index r) {
        const T s = rstd(r);
        T sum_gn = T(0);
        TESSERA_SIMD_REDUCTION(+ : sum_gn)
        for (Index c = 0; c < cols; ++c) sum_gn += T(loaded(dy(r, c))) * T(weight(c)) * T(x(r, c)) * s;
        const T mean_gn = sum_gn / T(cols);
        TESSERA_SIMD
        for (Index c = 0; c < cols; ++c)
          dx(r, c) = s * (T(loaded(dy(r, c))) * T(weight(c)) - T(x(r, c)) * s * mean_gn) + T(residual(r, c));
      });
}

}  // namespace tessera::kernels
