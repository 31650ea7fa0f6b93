#pragma once
// LayerNorm over the last dimension of a row-major (rows, C) matrix, with an affine weight and
// bias, as PyTorch's nn.LayerNorm(C, eps):
//   mean_r = (1/C) sum_c x_rc,   var_r = (1/C) sum_c (x_rc - mean_r)^2   (biased)
//   rstd_r = 1 / sqrt(var_r + eps),   n_rc = (x_rc - mean_r) rstd_r
//   y_rc   = n_rc weight_c + bias_c
// Saved for backward: mean (rows) and rstd (rows); backward also reads x and weight again.
// Backward, with g_rc = dy_rc weight_c:
//   dx_rc      = rstd_r (g_rc - mean_c(g_r.) - n_rc mean_c(g_r. n_r.))     (overwritten)
//   dweight_c += sum_r dy_rc n_rc,   dbias_c += sum_r dy_rc               (accumulated)
#include "kernels/math.hpp"
#include "kernels/precision.hpp"
#include "kernels/simd.hpp"
#include "kernels/views.hpp"

namespace tessera::kernels {

/// PyTorch's default epsilon of nn.LayerNorm.
inline constexpr double layernorm_eps = 1e-5;

/// \brief One row: writes y_row, returns the row's mean and rstd.
/// x, y, weight and bias are functors of the column index, so rows of any view type work;
/// y may alias x (each x(c) is read before y(c) is written, and never after).
template <class T, class XRow, class YRow, class WRow, class BRow>
KOKKOS_INLINE_FUNCTION void layernorm_row(const XRow& x, const YRow& y, const WRow& weight,
                                          const BRow& bias, Index cols, T eps, T& mean, T& rstd) {
  // Mean, then the variance about it (two passes: no cancellation of large means).
  T sum = T(0);
  TESSERA_SIMD_REDUCTION(+ : sum)
  for (Index c = 0; c < cols; ++c) sum += x(c);
  mean = sum / T(cols);
  T var = T(0);
  TESSERA_SIMD_REDUCTION(+ : var)
  for (Index c = 0; c < cols; ++c) {
    const T d = x(c) - mean;
    var += d * d;
  }
  var /= T(cols);
  rstd = T(1) / math::sqrt(var + eps);
  // Normalize and apply the affine map (reads x(c) before writing y(c): y may alias x).
  TESSERA_SIMD
  for (Index c = 0; c < cols; ++c) y(c) = (x(c) - mean) * rstd * weight(c) + bias(c);
}

/// \brief y = layernorm(x) * weight + bias, saving mean and rstd for backward.
/// x (rows,C), weight (C), bias (C), y (rows,C) (may alias x), mean (rows), rstd (rows).
/// y may be a bf16 buffer (std::uint16_t bit patterns, kernels/precision.hpp's stored()): the
/// row is computed in the precision of mean and y gets its values rounded to bf16.
/// One thread per row.
template <class XView, class WView, class BView, class YView, class MView, class RView>
void layernorm_forward(const ExecSpace& exec, const XView& x, const WView& weight, const BView& bias,
                       const YView& y, const MView& mean, const RView& rstd,
                       double eps = layernorm_eps) {
  using T = typename MView::non_const_value_type;
  const Index cols = Index(x.extent(1));
  const T eps_t = T(eps);
  Kokkos::parallel_for(
      "tessera::layernorm_forward", range(exec, Index(x.extent(0))), KOKKOS_LAMBDA(const Index r) {
        T m = T(0), s = T(0);
        layernorm_row<T>([&](Index c) { return x(r, c); }, [&](Index c) -> decltype(auto) { return stored(y(r, c)); },
                         [&](Index c) { return weight(c); }, [&](Index c) { return bias(c); }, cols,
                         eps_t, m, s);
        mean(r) = m;
        rstd(r) = s;
      });
}

/// \brief One row of dx: dx_c = rstd (g_c - mean(g) - n_c mean(g n)) + res_c, g_c = dy_c weight_c.
/// dx may alias dy (both reductions finish before the first dx is written) and res.
template <class T, class XRow, class DyRow, class WRow, class ResRow, class DxRow>
KOKKOS_INLINE_FUNCTION void layernorm_backward_row(const XRow& x, const DyRow& dy, const WRow& weight,
                                                   const ResRow& res, const DxRow& dx, Index cols, T mean,
                                                   T rstd) {
  T sum_g = T(0), sum_gn = T(0);
  TESSERA_SIMD_REDUCTION(+ : sum_g, sum_gn)
  for (Index c = 0; c < cols; ++c) {
    const T g = dy(c) * weight(c);
    sum_g += g;
    sum_gn += g * (x(c) - mean) * rstd;
  }
  const T mean_g = sum_g / T(cols), mean_gn = sum_gn / T(cols);
  TESSERA_SIMD
  for (Index c = 0; c < cols; ++c) {
    const T n = (x(c) - mean) * rstd;
    dx(c) = rstd * (dy(c) * weight(c) - mean_g - n * mean_gn) + res(c);
  }
}

/// The residual of a layernorm_backward without one.
struct NoResidual {
  KOKKOS_INLINE_FUNCTION int operator()(Index, Index) const { return 0; }
};

/// \brief Gradients of layernorm_forward: dx = the input gradient + residual (overwritten; the
/// residual stream's gradient, when the LayerNorm sits on one, added in the same pass), dweight
/// and dbias accumulated (+=, for micro-batches).
/// x (rows,C), weight (C), mean (rows), rstd (rows) as saved by layernorm_forward,
/// dy (rows,C) (fp32, or bf16 bit patterns read as their float values), dx (rows,C) (may alias
/// dy or residual), dweight (C), dbias (C),
/// residual (rows,C) or NoResidual.
/// dweight and dbias: one thread per column looping over the rows (no atomics, fixed order);
/// they run before dx, so dx may overwrite dy.
template <class XView, class WView, class MView, class RView, class DyView, class DxView,
          class DwView, class DbView, class ResView = NoResidual>
void layernorm_backward(const ExecSpace& exec, const XView& x, const WView& weight,
                        const MView& mean, const RView& rstd, const DyView& dy, const DxView& dx,
                        const DwView& dweight, const DbView& dbias, const ResView& residual = {}) {
  using T = typename DxView::non_const_value_type;
  const Index rows = Index(x.extent(0)), cols = Index(x.extent(1));
  // Parameter gradients: column sums over the rows, one thread per block of columns as in
  // bias_backward; each column's order fixed.
  const Index width = column_block(exec, cols);
  Kokkos::parallel_for(
      "tessera::layernorm_backward::params", range(exec, (cols + width - 1) / width),
      KOKKOS_LAMBDA(const Index block) {
        const Index c0 = block * width;
        const Index n = cols - c0 < width ? cols - c0 : width;
        T sum_w[column_block_max] = {}, sum_b[column_block_max] = {};
        for (Index r = 0; r < rows; ++r) {
          const T m = mean(r), s = rstd(r);
          TESSERA_SIMD
          for (Index k = 0; k < n; ++k) {
            const T g = loaded(dy(r, c0 + k));
            sum_w[k] += g * (x(r, c0 + k) - m) * s;
            sum_b[k] += g;
          }
        }
        for (Index k = 0; k < n; ++k) {
          dweight(c0 + k) += sum_w[k];
          dbias(c0 + k) += sum_b[k];
        }
      });
  // Input gradient: one thread per row.
  Kokkos::parallel_for(
      "tessera::layernorm_backward::dx", range(exec, rows), KOKKOS_LAMBDA(const Index r) {
        layernorm_backward_row<T>([&](Index c) { return x(r, c); }, [&](Index c) { return T(loaded(dy(r, c))); },
                                  [&](Index c) { return weight(c); },
                                  [&](Index c) { return T(residual(r, c)); },
                                  [&](Index c) -> T& { return dx(r, c); }, cols, T(mean(r)),
                                  T(rstd(r)));
      });
}

}  // namespace tessera::kernels
