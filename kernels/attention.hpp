#pragma once
// Causal multi-head self-attention core (after the fused QKV projection, before the output
// projection), as in GPT-2, optionally over a sliding window (Mistral's sliding_window).
//   qkv (B*T, 3C): row b*T+t holds q at columns [0,C), k at [C,2C), v at [2C,3C); head h uses
//   columns h*hd .. (h+1)*hd of each, hd = C/heads.
// For every batch b and head h, with q_i, k_j, v_j the head's hd-vectors at positions i, j:
//   S_ij = q_i . k_j / sqrt(hd)                    for lo_i <= j <= i (causal mask: j > i excluded)
//   P_ij = exp(S_ij - max_j S_ij) / sum_j(...)     (softmax over lo_i <= j <= i; P_ij = 0 elsewhere)
//   out_i = sum_{lo_i<=j<=i} P_ij v_j              written to out (B*T, C) at head h's columns
// lo_i = 0 (full causal attention, window = 0), or under a sliding window of W positions
// lo_i = max(0, i - W + 1): query i sees itself and the W - 1 keys before it (i - W < j <= i).
// Saved for backward: att = P (B, heads, T, T); backward also reads qkv again.
// Backward from dout (B*T, C), with D_i = sum_j P_ij dP_ij:
//   dP_ij = dout_i . v_j,   dS_ij = P_ij (dP_ij - D_i)
//   dq_i = sum_j dS_ij k_j / sqrt(hd),  dk_j = sum_i dS_ij q_i / sqrt(hd),  dv_j = sum_i P_ij dout_i
// written to dqkv (B*T, 3C) at the same columns as q, k, v (overwritten). dS is kept in a
// caller-provided scratch of the shape of att so that dk and dv are sums without atomics.
// Straightforward loops, one thread per (b, h, row): correctness first, not speed.
#include <stdexcept>
#include <string>

#include "kernels/math.hpp"
#include "kernels/views.hpp"

namespace tessera::kernels {

/// \brief The first key query i sees: 0, or under a sliding window of `window` positions (0: none)
/// i - window + 1 where that is positive.
KOKKOS_INLINE_FUNCTION Index window_first_key(Index i, Index window) {
  return window > 0 && i >= window ? i - window + 1 : 0;
}

/// \brief One past the last query of a sequence of `seq` that sees key j: seq, or under a sliding
/// window j + window where that is shorter.
KOKKOS_INLINE_FUNCTION Index window_query_end(Index j, Index seq, Index window) {
  return window > 0 && j + window < seq ? j + window : seq;
}

/// Attention probabilities and their gradients: (B, heads, T, T), row-major.
template <class T, class Mem = MemSpace>
using AttentionView = Kokkos::View<T****, Kokkos::LayoutRight, Mem>;

/// Shapes of one attention call, checked against the views on the host.
struct AttentionShape {
  Index batch = 0, seq = 0, channels = 0, heads = 0, head_dim = 0;
};

/// \brief Checks qkv (B*T, 3C), out (B*T, C), att (B, heads, T, T) against each other and
/// returns the shape. Throws std::invalid_argument on a mismatch.
template <class QkvView, class OutView, class AttView>
AttentionShape attention_shape(const QkvView& qkv, const OutView& out, const AttView& att) {
  AttentionShape s;
  s.batch = Index(att.extent(0));
  s.heads = Index(att.extent(1));
  s.seq = Index(att.extent(2));
  s.channels = Index(out.extent(1));
  if (s.heads < 1 || s.channels % s.heads != 0) {
    std::string msg = "tessera::attention: channels ";
    msg += std::to_string(s.channels);
    msg += " not divisible by heads ";
    msg += std::to_string(s.heads);
    throw std::invalid_argument(msg);
  }
  s.head_dim = s.channels / s.heads;
  const bool ok = Index(att.extent(3)) == s.seq && Index(qkv.extent(0)) == s.batch * s.seq &&
                  Index(qkv.extent(1)) == 3 * s.channels && Index(out.extent(0)) == s.batch * s.seq;
  if (!ok) {
    throw std::invalid_argument(
        "tessera::attention: expected qkv (B*T, 3C), out (B*T, C), att (B, heads, T, T)");
  }
  return s;
}

/// \brief Forward of causal self-attention: att = softmax(mask(q k^T / sqrt(hd))), out = att v.
/// qkv (B*T, 3C), out (B*T, C) (overwritten), att (B, heads, T, T) (overwritten, zero above
/// the diagonal and left of the window). window: the positions each query sees (0: all up to
/// itself). One thread per (b, h, i).
template <class QkvView, class OutView, class AttView>
void attention_forward(const ExecSpace& exec, const QkvView& qkv, const OutView& out,
                       const AttView& att, Index window = 0) {
  using T = typename OutView::non_const_value_type;
  const AttentionShape s = attention_shape(qkv, out, att);
  const Index seq = s.seq, heads = s.heads, hd = s.head_dim, channels = s.channels;
  const T scale = T(1) / math::sqrt(T(hd));
  Kokkos::parallel_for(
      "tessera::attention_forward", range(exec, s.batch * heads * seq), KOKKOS_LAMBDA(const Index idx) {
        const Index i = idx % seq, h = (idx / seq) % heads, b = idx / (seq * heads);
        const Index qi = b * seq + i, qc = h * hd, kc = channels + h * hd, vc = 2 * channels + h * hd;
        const Index lo = window_first_key(i, window);
        // Scores of the unmasked keys, and their max.
        T row_max = T(0);
        for (Index j = lo; j <= i; ++j) {
          T dot = T(0);
          for (Index d = 0; d < hd; ++d) dot += qkv(qi, qc + d) * qkv(b * seq + j, kc + d);
          dot *= scale;
          att(b, h, i, j) = dot;
          if (j == lo || dot > row_max) row_max = dot;
        }
        // Softmax, shifted by the max; zeros above the diagonal and left of the window.
        T sum = T(0);
        for (Index j = lo; j <= i; ++j) {
          const T e = math::exp(att(b, h, i, j) - row_max);
          att(b, h, i, j) = e;
          sum += e;
        }
        const T inv_sum = T(1) / sum;
        for (Index j = lo; j <= i; ++j) att(b, h, i, j) *= inv_sum;
        for (Index j = 0; j < lo; ++j) att(b, h, i, j) = T(0);
        for (Index j = i + 1; j < seq; ++j) att(b, h, i, j) = T(0);
        // out_i = sum_j P_ij v_j.
        for (Index d = 0; d < hd; ++d) {
          T acc = T(0);
          for (Index j = lo; j <= i; ++j) acc += att(b, h, i, j) * qkv(b * seq + j, vc + d);
          out(qi, qc + d) = acc;
        }
      });
}

/// \brief Backward of attention_forward: dqkv (overwritten) from dout.
/// qkv (B*T, 3C) and att (B, heads, T, T) as in the forward, dout (B*T, C),
/// dqkv (B*T, 3C) (overwritten), dscores (B, heads, T, T) scratch (overwritten with dS); window
/// as the forward's. Two passes: one thread per (b, h, i) computes the row dS_i. and dq_i; then
/// one thread per (b, h, j) sums dk_j and dv_j over the queries i >= j that see key j. No atomics;
/// the summation order is fixed.
template <class QkvView, class AttView, class DoutView, class DqkvView, class DsView>
void attention_backward(const ExecSpace& exec, const QkvView& qkv, const AttView& att,
                        const DoutView& dout, const DqkvView& dqkv, const DsView& dscores, Index window = 0) {
  using T = typename DqkvView::non_const_value_type;
  const AttentionShape s = attention_shape(qkv, dout, att);
  if (dscores.extent(0) != att.extent(0) || dscores.extent(1) != att.extent(1) ||
      dscores.extent(2) != att.extent(2) || dscores.extent(3) != att.extent(3) ||
      dqkv.extent(0) != qkv.extent(0) || dqkv.extent(1) != qkv.extent(1)) {
    throw std::invalid_argument(
        "tessera::attention_backward: dqkv must match qkv and dscores must match att");
  }
  const Index seq = s.seq, heads = s.heads, hd = s.head_dim, channels = s.channels;
  const Index rows = s.batch * heads * seq;
  const T scale = T(1) / math::sqrt(T(hd));
  // Pass 1: dS_i. and dq_i.
  Kokkos::parallel_for(
      "tessera::attention_backward::dq", range(exec, rows), KOKKOS_LAMBDA(const Index idx) {
        const Index i = idx % seq, h = (idx / seq) % heads, b = idx / (seq * heads);
        const Index qi = b * seq + i, qc = h * hd, kc = channels + h * hd, vc = 2 * channels + h * hd;
        const Index lo = window_first_key(i, window);
        // dP_ij = dout_i . v_j (kept in dscores), and D_i = sum_j P_ij dP_ij.
        T row_dot = T(0);
        for (Index j = lo; j <= i; ++j) {
          T dp = T(0);
          for (Index d = 0; d < hd; ++d) dp += dout(qi, qc + d) * qkv(b * seq + j, vc + d);
          dscores(b, h, i, j) = dp;
          row_dot += att(b, h, i, j) * dp;
        }
        // dS_ij = P_ij (dP_ij - D_i); zero where masked.
        for (Index j = lo; j <= i; ++j) dscores(b, h, i, j) = att(b, h, i, j) * (dscores(b, h, i, j) - row_dot);
        for (Index j = 0; j < lo; ++j) dscores(b, h, i, j) = T(0);
        for (Index j = i + 1; j < seq; ++j) dscores(b, h, i, j) = T(0);
        // dq_i = scale sum_j dS_ij k_j.
        for (Index d = 0; d < hd; ++d) {
          T acc = T(0);
          for (Index j = lo; j <= i; ++j) acc += dscores(b, h, i, j) * qkv(b * seq + j, kc + d);
          dqkv(qi, qc + d) = scale * acc;
        }
      });
  // Pass 2: dk_j and dv_j, sums over the queries i >= j that see key j.
  Kokkos::parallel_for(
      "tessera::attention_backward::dkv", range(exec, rows), KOKKOS_LAMBDA(const Index idx) {
        const Index j = idx % seq, h = (idx / seq) % heads, b = idx / (seq * heads);
        const Index kj = b * seq + j, qc = h * hd, kc = channels + h * hd, vc = 2 * channels + h * hd;
        const Index end = window_query_end(j, seq, window);
        for (Index d = 0; d < hd; ++d) {
          T acc_k = T(0), acc_v = T(0);
          for (Index i = j; i < end; ++i) {
            acc_k += dscores(b, h, i, j) * qkv(b * seq + i, qc + d);
            acc_v += att(b, h, i, j) * dout(b * seq + i, qc + d);
          }
          dqkv(kj, kc + d) = scale * acc_k;
          dqkv(kj, vc + d) = acc_v;
        }
      });
}

}  // namespace tessera::kernels
