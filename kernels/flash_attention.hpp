#pragma once
// Fused causal multi-head self-attention with an online softmax (the recurrence of
// FlashAttention): the function of kernels/attention.hpp, which stays the reference, without the
// (B, heads, T, T) probabilities in memory. Layouts of qkv, out, dout and dqkv as there.
//
// Under a sliding window of W positions (window > 0) query i sees only keys i - W < j <= i, and
// key j only queries j <= i < j + W: every loop below runs over that band (kernels/attention.hpp's
// window_first_key, window_query_end) and never visits the keys or queries outside it, so a row
// costs O(W) instead of O(T). window = 0 (or at least T) is full causal attention.
//
// Forward, one thread per query row i of (b, h): over the keys j <= i a running maximum m of the
// scaled scores S_ij = q_i . k_j / sqrt(hd), the running sum l of exp(S_ij - m) and the running
// sum acc of exp(S_ij - m) v_j, rescaled by exp(m_old - m_new) whenever m grows; out_i = acc / l
// and stats(b, h, i, 0) = m + log l, the row's log-sum-exp, so that P_ij = exp(S_ij - stats_i).
// Backward recomputes P from q, k and stats wherever it needs it, in four passes that write
// disjoint outputs (no atomics; every sum in a fixed order):
//   1. per query i: D_i = sum_j P_ij dP_ij, dP_ij = dout_i . v_j           -> dstats(b, h, i, 0)
//   2. per query i: dq_i = sum_j P_ij (dP_ij - D_i) k_j / sqrt(hd)
//   3. per key j:   dv_j = sum_{i >= j} P_ij dout_i
//   4. per key j:   dk_j = sum_{i >= j} P_ij (dP_ij - D_i) q_i / sqrt(hd)
// Neighbouring threads take neighbouring rows of one (b, h), so at each step of their loops they
// read the same row of the other operand (one broadcast load on a GPU).
//
// A thread keeps its row's vectors in registers: the head width hd is padded to HD = 16, 32, 64
// or 128, a compile-time size, so that every loop over it unrolls (a run-time index would put the
// arrays in local memory). Head widths above 128 are refused.
#include <stdexcept>
#include <string>

#include "kernels/attention.hpp"
#include "kernels/math.hpp"
#include "kernels/views.hpp"

#if defined(__CUDA_ARCH__) || defined(__HIP_DEVICE_COMPILE__)
#define TESSERA_UNROLL _Pragma("unroll")
#else
#define TESSERA_UNROLL
#endif

namespace tessera::kernels {

namespace flash {

/// v = scale * qkv(row, col .. col+hd), zero beyond hd.
template <int HD, class T, class View>
KOKKOS_INLINE_FUNCTION void load(const View& qkv, Index row, Index col, Index hd, T scale, T (&v)[HD]) {
  TESSERA_UNROLL
  for (int d = 0; d < HD; ++d) v[d] = d < hd ? scale * qkv(row, col + d) : T(0);
}

/// a . qkv(row, col .. col+hd).
template <int HD, class T, class View>
KOKKOS_INLINE_FUNCTION T dot(const T (&a)[HD], const View& qkv, Index row, Index col, Index hd) {
  T s = T(0);
  TESSERA_UNROLL
  for (int d = 0; d < HD; ++d)
    if (d < hd) s += a[d] * qkv(row, col + d);
  return s;
}

/// acc += p * qkv(row, col .. col+hd).
template <int HD, class T, class View>
KOKKOS_INLINE_FUNCTION void axpy(T p, const View& qkv, Index row, Index col, Index hd, T (&acc)[HD]) {
  TESSERA_UNROLL
  for (int d = 0; d < HD; ++d)
    if (d < hd) acc[d] += p * qkv(row, col + d);
}

/// out(row, col .. col+hd) = scale * v.
template <int HD, class T, class View>
KOKKOS_INLINE_FUNCTION void store(const View& out, Index row, Index col, Index hd, T scale, const T (&v)[HD]) {
  TESSERA_UNROLL
  for (int d = 0; d < HD; ++d)
    if (d < hd) out(row, col + d) = scale * v[d];
}

/// Where a flat thread index points: row r (query or key) of head h of sample b, and the
/// columns of that head's q, k and v in qkv.
struct Row {
  Index r, b, h, base, qc, kc, vc;
  KOKKOS_INLINE_FUNCTION Row(Index idx, const AttentionShape& s)
      : r(idx % s.seq), b(idx / (s.seq * s.heads)), h((idx / s.seq) % s.heads), base(b * s.seq),
        qc(h * s.head_dim), kc(s.channels + qc), vc(2 * s.channels + qc) {}
};

template <int HD, class QkvView, class OutView, class StatView>
void forward(const ExecSpace& exec, const QkvView& qkv, const OutView& out, const StatView& stats,
             const AttentionShape& s, Index window) {
  using T = typename OutView::non_const_value_type;
  const Index hd = s.head_dim;
  const T scale = T(1) / math::sqrt(T(hd));
  Kokkos::parallel_for(
      "tessera::flash_attention_forward", range(exec, s.batch * s.heads * s.seq), KOKKOS_LAMBDA(const Index idx) {
        const Row w(idx, s);
        const Index lo = window_first_key(w.r, window);
        T q[HD], acc[HD];
        load<HD>(qkv, w.base + w.r, w.qc, hd, scale, q);
        load<HD>(qkv, w.base + lo, w.vc, hd, T(1), acc);  // key lo: P = 1 relative to itself
        T m = dot<HD>(q, qkv, w.base + lo, w.kc, hd), l = T(1);
        for (Index j = lo + 1; j <= w.r; ++j) {
          const T sc = dot<HD>(q, qkv, w.base + j, w.kc, hd);
          if (sc > m) {  // a new maximum: rescale what was summed against the old one
            const T c = math::exp(m - sc);
            l *= c;
            TESSERA_UNROLL
            for (int d = 0; d < HD; ++d) acc[d] *= c;
            m = sc;
          }
          const T p = math::exp(sc - m);
          l += p;
          axpy<HD>(p, qkv, w.base + j, w.vc, hd, acc);
        }
        store<HD>(out, w.base + w.r, w.qc, hd, T(1) / l, acc);
        stats(w.b, w.h, w.r, 0) = m + math::log(l);
      });
}

/// Passes 1 and 2: D_i into dstats, then dq_i.
template <int HD, class QkvView, class StatView, class DoutView, class DqkvView>
void backward_queries(const ExecSpace& exec, const QkvView& qkv, const StatView& stats, const DoutView& dout,
                      const DqkvView& dqkv, const StatView& dstats, const AttentionShape& s, Index window) {
  using T = typename DqkvView::non_const_value_type;
  const Index hd = s.head_dim;
  const T scale = T(1) / math::sqrt(T(hd));
  const Index rows = s.batch * s.heads * s.seq;
  Kokkos::parallel_for(
      "tessera::flash_attention_backward::D", range(exec, rows), KOKKOS_LAMBDA(const Index idx) {
        const Row w(idx, s);
        T q[HD], g[HD];
        load<HD>(qkv, w.base + w.r, w.qc, hd, scale, q);
        load<HD>(dout, w.base + w.r, w.qc, hd, T(1), g);
        const T lse = stats(w.b, w.h, w.r, 0);
        T sum = T(0);
        for (Index j = window_first_key(w.r, window); j <= w.r; ++j)
          sum += math::exp(dot<HD>(q, qkv, w.base + j, w.kc, hd) - lse) * dot<HD>(g, qkv, w.base + j, w.vc, hd);
        dstats(w.b, w.h, w.r, 0) = sum;
      });
  Kokkos::parallel_for(
      "tessera::flash_attention_backward::dq", range(exec, rows), KOKKOS_LAMBDA(const Index idx) {
        const Row w(idx, s);
        T q[HD], g[HD], dq[HD];
        load<HD>(qkv, w.base + w.r, w.qc, hd, scale, q);
        load<HD>(dout, w.base + w.r, w.qc, hd, T(1), g);
        TESSERA_UNROLL
        for (int d = 0; d < HD; ++d) dq[d] = T(0);
        const T lse = stats(w.b, w.h, w.r, 0), D = dstats(w.b, w.h, w.r, 0);
        for (Index j = window_first_key(w.r, window); j <= w.r; ++j) {
          const T p = math::exp(dot<HD>(q, qkv, w.base + j, w.kc, hd) - lse);
          axpy<HD>(p * (dot<HD>(g, qkv, w.base + j, w.vc, hd) - D), qkv, w.base + j, w.kc, hd, dq);
        }
        store<HD>(dqkv, w.base + w.r, w.qc, hd, scale, dq);
      });
}

/// Passes 3 and 4: dv_j, then dk_j, each a sum over the queries i >= j that see key j.
template <int HD, class QkvView, class StatView, class DoutView, class DqkvView>
void backward_keys(const ExecSpace& exec, const QkvView& qkv, const StatView& stats, const DoutView& dout,
                   const DqkvView& dqkv, const StatView& dstats, const AttentionShape& s, Index window) {
  using T = typename DqkvView::non_const_value_type;
  const Index hd = s.head_dim, seq = s.seq;
  const T scale = T(1) / math::sqrt(T(hd));
  const Index rows = s.batch * s.heads * s.seq;
  Kokkos::parallel_for(
      "tessera::flash_attention_backward::dv", range(exec, rows), KOKKOS_LAMBDA(const Index idx) {
        const Row w(idx, s);
        T k[HD], dv[HD];
        load<HD>(qkv, w.base + w.r, w.kc, hd, scale, k);
        TESSERA_UNROLL
        for (int d = 0; d < HD; ++d) dv[d] = T(0);
        for (Index i = w.r, end = window_query_end(w.r, seq, window); i < end; ++i) {
          const T p = math::exp(dot<HD>(k, qkv, w.base + i, w.qc, hd) - stats(w.b, w.h, i, 0));
          axpy<HD>(p, dout, w.base + i, w.qc, hd, dv);
        }
        store<HD>(dqkv, w.base + w.r, w.vc, hd, T(1), dv);
      });
  Kokkos::parallel_for(
      "tessera::flash_attention_backward::dk", range(exec, rows), KOKKOS_LAMBDA(const Index idx) {
        const Row w(idx, s);
        T k[HD], v[HD], dk[HD];
        load<HD>(qkv, w.base + w.r, w.kc, hd, scale, k);
        load<HD>(qkv, w.base + w.r, w.vc, hd, T(1), v);
        TESSERA_UNROLL
        for (int d = 0; d < HD; ++d) dk[d] = T(0);
        for (Index i = w.r, end = window_query_end(w.r, seq, window); i < end; ++i) {
          const T p = math::exp(dot<HD>(k, qkv, w.base + i, w.qc, hd) - stats(w.b, w.h, i, 0));
          const T ds = p * (dot<HD>(v, dout, w.base + i, w.qc, hd) - dstats(w.b, w.h, i, 0));
          axpy<HD>(ds, qkv, w.base + i, w.qc, hd, dk);
        }
        store<HD>(dqkv, w.base + w.r, w.kc, hd, scale, dk);
      });
}

/// qkv, out and stats against each other: stats (B, heads, T, 1); the head width at most 128.
template <class QkvView, class OutView, class StatView>
AttentionShape shape(const QkvView& qkv, const OutView& out, const StatView& stats) {
  AttentionShape s;
  s.batch = Index(stats.extent(0));
  s.heads = Index(stats.extent(1));
  s.seq = Index(stats.extent(2));
  s.channels = Index(out.extent(1));
  const bool ok = s.heads >= 1 && s.channels % s.heads == 0 && stats.extent(3) == 1 &&
                  Index(qkv.extent(0)) == s.batch * s.seq && Index(qkv.extent(1)) == 3 * s.channels &&
                  Index(out.extent(0)) == s.batch * s.seq;
  if (!ok)
    throw std::invalid_argument(
        "tessera::flash_attention: expected qkv (B*T, 3C), out (B*T, C), stats (B, heads, T, 1), heads | C");
  s.head_dim = s.channels / s.heads;
  if (s.head_dim > 128)
    throw std::invalid_argument("tessera::flash_attention: head width " + std::to_string(s.head_dim) +
                                " (model.width / model.heads) exceeds 128, the most the fused kernels take");
  return s;
}

/// The register width of a head of width hd: the smallest of 16, 32, 64, 128 that holds it.
inline int padded(Index hd) { return hd <= 16 ? 16 : hd <= 32 ? 32 : hd <= 64 ? 64 : 128; }

}  // namespace flash

/// \brief Forward of causal self-attention: out (B*T, C) overwritten from qkv (B*T, 3C), stats
/// (B, heads, T, 1) overwritten with each row's log-sum-exp (what the backward needs); window: the
/// positions each query sees, itself included (0: every earlier one).
template <class QkvView, class OutView, class StatView>
void flash_attention_forward(const ExecSpace& exec, const QkvView& qkv, const OutView& out, const StatView& stats,
                             Index window = 0) {
  const AttentionShape s = flash::shape(qkv, out, stats);
  if (window < 0) throw std::invalid_argument("tessera::flash_attention: a window of " + std::to_string(window));
  switch (flash::padded(s.head_dim)) {
    case 16: flash::forward<16>(exec, qkv, out, stats, s, window); break;
    case 32: flash::forward<32>(exec, qkv, out, stats, s, window); break;
    case 64: flash::forward<64>(exec, qkv, out, stats, s, window); break;
    default: flash::forward<128>(exec, qkv, out, stats, s, window); break;
  }
}

/// \brief Backward of flash_attention_forward: dqkv (B*T, 3C) overwritten from dout (B*T, C),
/// with qkv, stats and the window of the forward; dstats (B, heads, T, 1) is scratch.
template <class QkvView, class StatView, class DoutView, class DqkvView>
void flash_attention_backward(const ExecSpace& exec, const QkvView& qkv, const StatView& stats, const DoutView& dout,
                              const DqkvView& dqkv, const StatView& dstats, Index window = 0) {
  const AttentionShape s = flash::shape(qkv, dout, stats);
  if (dqkv.extent(0) != qkv.extent(0) || dqkv.extent(1) != qkv.extent(1) || dstats.extent(0) != stats.extent(0) ||
      dstats.extent(1) != stats.extent(1) || dstats.extent(2) != stats.extent(2) || dstats.extent(3) != 1)
    throw std::invalid_argument("tessera::flash_attention_backward: dqkv must match qkv and dstats stats");
  if (window < 0) throw std::invalid_argument("tessera::flash_attention: a window of " + std::to_string(window));
  switch (flash::padded(s.head_dim)) {
    case 16:
      flash::backward_queries<16>(exec, qkv, stats, dout, dqkv, dstats, s, window);
      flash::backward_keys<16>(exec, qkv, stats, dout, dqkv, dstats, s, window);
      break;
    case 32:
      flash::backward_queries<32>(exec, qkv, stats, dout, dqkv, dstats, s, window);
      flash::backward_keys<32>(exec, qkv, stats, dout, dqkv, dstats, s, window);
      break;
    case 64:
      flash::backward_queries<64>(exec, qkv, stats, dout, dqkv, dstats, s, window);
      flash::backward_keys<64>(exec, qkv, stats, dout, dqkv, dstats, s, window);
      break;
    default:
      flash::backward_queries<128>(exec, qkv, stats, dout, dqkv, dstats, s, window);
      flash::backward_keys<128>(exec, qkv, stats, dout, dqkv, dstats, s, window);
      break;
  }
}

}  // namespace tessera::kernels
