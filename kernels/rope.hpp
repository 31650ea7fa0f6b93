#pragma once
// Rotary position embeddings (RoPE) in Hugging Face's half-split convention (rotate_half), and
// grouped-query attention's sharing of key/value heads, between the compact outputs of the q, k
// and v projections and the attention's operands (every query head with its own k and v, as the
// GPT's attention reads them; Hugging Face's repeat_kv):
//   for a head vector x of width hd at position t, with h2 = hd/2 and i < h2:
//     angle_i = t theta^(-2i/hd),  c = cos(angle_i), s = sin(angle_i)
//     rope(x)_i      = x_i c - x_{i+h2} s
//     rope(x)_{i+h2} = x_{i+h2} c + x_i s
//   query head h reads key/value head h / (H / KV).
// Backward applies the transposed rotation and sums the gradients of the query heads that shared
// a key/value head.
#include <cmath>
#include <vector>

#include "kernels/precision.hpp"
#include "kernels/positions.hpp"
#include "kernels/views.hpp"

namespace tessera::kernels {

/// \brief The rotation tables for positions [0, seq) of heads hd wide: cos and sin, each
/// (seq, hd/2) row-major, computed in double and rounded to T.
template <class T>
void rope_tables(int seq, int hd, double theta, std::vector<T>& cos_t, std::vector<T>& sin_t) {
  const int h2 = hd / 2;
  cos_t.assign(std::size_t(seq) * std::size_t(h2), T(0));
  sin_t.assign(cos_t.size(), T(0));
  for (int t = 0; t < seq; ++t)
    for (int i = 0; i < h2; ++i) {
      const double a = double(t) * std::pow(theta, -2.0 * double(i) / double(hd));
      cos_t[std::size_t(t) * std::size_t(h2) + std::size_t(i)] = T(std::cos(a));
      sin_t[std::size_t(t) * std::size_t(h2) + std::size_t(i)] = T(std::sin(a));
    }
}

/// The attention's operands as the GPT's fused (rows, 3 H hd) matrix: part p (q, k, v) of head h
/// at columns p H hd + h hd.
template <class View>
struct FusedHeads {
  View m;
  Index heads, hd;
  KOKKOS_INLINE_FUNCTION auto& operator()(Index r, Index p, Index h, Index e) const {
    return m(r, (p * heads + h) * hd + e);
  }
};

/// The same as the bf16 attention's head blocks (nn::qkv_to_bf16): part p of head h of sample b
/// is the seq x hd block at ((b 3 + p) H + h) seq hd.
struct HeadBlocks {
  std::uint16_t* base;
  Index heads, hd, seq;
  KOKKOS_INLINE_FUNCTION std::uint16_t& operator()(Index r, Index p, Index h, Index e) const {
    const Index b = r / seq, t = r % seq;
    return base[((b * 3 + p) * heads + h) * seq * hd + t * hd + e];
  }
};

/// \brief The attention's operands from the projections: out(r, p, h, e) gets q rotated, k
/// rotated and v, key/value heads repeated over their query heads. q (rows, H hd), k and v
/// (rows, KV hd) (fp32 or bf16, read as their values); cos, sin (seq hd/2) from rope_tables;
/// row r is position pos(r % seq) (where a rank's rows of the sequence sit under context
/// parallelism: kernels/positions.hpp). Comp is the arithmetic's type. One thread per row.
template <class Comp, class QView, class KView, class VView, class TabView, class Out>
void rope_expand(const ExecSpace& exec, const QView& q, const KView& k, const VView& v, const TabView& cos_t,
                 const TabView& sin_t, Index heads, Index kv_heads, Index seq, const Out& out, Positions pos = {}) {
  const Index rows = Index(q.extent(0)), hd = Index(q.extent(1)) / heads, h2 = hd / 2, group = heads / kv_heads;
  Kokkos::parallel_for(
      "tessera::rope_expand", range(exec, rows), KOKKOS_LAMBDA(const Index r) {
        const Index t = pos(r % seq);
        for (Index h = 0; h < heads; ++h) {
          const Index g = h / group;
          for (Index i = 0; i < h2; ++i) {
            const Comp c = Comp(cos_t(t * h2 + i)), s = Comp(sin_t(t * h2 + i));
            const Comp qa = Comp(loaded(q(r, h * hd + i))), qb = Comp(loaded(q(r, h * hd + i + h2)));
            stored(out(r, 0, h, i)) = qa * c - qb * s;
            stored(out(r, 0, h, i + h2)) = qb * c + qa * s;
            const Comp ka = Comp(loaded(k(r, g * hd + i))), kb = Comp(loaded(k(r, g * hd + i + h2)));
            stored(out(r, 1, h, i)) = ka * c - kb * s;
            stored(out(r, 1, h, i + h2)) = kb * c + ka * s;
          }
          for (Index e = 0; e < hd; ++e) stored(out(r, 2, h, e)) = Comp(loaded(v(r, g * hd + e)));
        }
      });
}

/// \brief Backward of rope_expand: dq, dk, dv (stored(): fp32 or bf16) from the gradients of the
/// attention's operands din(r, p, h, e) (read as values): dq the transposed rotation of each
/// head's, dk of the sum over the query heads sharing each key/value head (in head order), dv
/// that sum. Shapes as rope_expand's. One thread per row.
template <class Comp, class In, class TabView, class DqView, class DkView, class DvView>
void rope_reduce(const ExecSpace& exec, const In& din, const TabView& cos_t, const TabView& sin_t, Index heads,
                 Index kv_heads, Index seq, const DqView& dq, const DkView& dk, const DvView& dv, Positions pos = {}) {
  const Index rows = Index(dq.extent(0)), hd = Index(dq.extent(1)) / heads, h2 = hd / 2, group = heads / kv_heads;
  Kokkos::parallel_for(
      "tessera::rope_reduce", range(exec, rows), KOKKOS_LAMBDA(const Index r) {
        const Index t = pos(r % seq);
        for (Index h = 0; h < heads; ++h)
          for (Index i = 0; i < h2; ++i) {
            const Comp c = Comp(cos_t(t * h2 + i)), s = Comp(sin_t(t * h2 + i));
            const Comp a = Comp(loaded(din(r, 0, h, i))), b = Comp(loaded(din(r, 0, h, i + h2)));
            stored(dq(r, h * hd + i)) = a * c + b * s;
            stored(dq(r, h * hd + i + h2)) = b * c - a * s;
          }
        for (Index g = 0; g < kv_heads; ++g) {
          for (Index i = 0; i < h2; ++i) {
            const Comp c = Comp(cos_t(t * h2 + i)), s = Comp(sin_t(t * h2 + i));
            Comp a = Comp(0), b = Comp(0);
            for (Index j = 0; j < group; ++j) {
              a += Comp(loaded(din(r, 1, g * group + j, i)));
              b += Comp(loaded(din(r, 1, g * group + j, i + h2)));
            }
            stored(dk(r, g * hd + i)) = a * c + b * s;
            stored(dk(r, g * hd + i + h2)) = b * c - a * s;
          }
          for (Index e = 0; e < hd; ++e) {
            Comp sum = Comp(0);
            for (Index j = 0; j < group; ++j) sum += Comp(loaded(din(r, 2, g * group + j, e)));
            stored(dv(r, g * hd + e)) = sum;
          }
        }
      });
}

}  // namespace tessera::kernels
