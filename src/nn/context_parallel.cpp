// The transformers' attention under context parallelism (parallel.spatial = sp > 1), in the
// all-to-all form (DeepSpeed Ulysses; the ring's is nn/context_ring.cpp): each rank of a context group holds T/sp positions of every
// sequence for every activation. Around the attention, one all-to-all regroups q, k and v from
// (all heads, the rank's positions) to (heads/sp of them, every position), the attention runs on
// whole sequences as without context parallelism (causal, under the model's sliding window if it
// has one: the same kernels, the window over the sequence's positions), and a second
// all-to-all returns y to the positions. Backward mirrors it: dy to heads, the attention's
// backward, dq, dk, dv back to positions. Bytes per rank and block: 3 C/tp (T/sp) forward in, C/tp
// (T/sp) out, the same again backward, each (sp - 1)/sp of it crossing ranks.
//
// The layouts (B samples, P column groups of H = heads_local_ heads of hd; Hs = H/sp; rank r of
// the group holds positions [r T/sp, (r+1) T/sp) and, after the regroup, heads [r Hs, (r+1) Hs)):
//   local     (B T/sp, P H hd):  row b T/sp + t, column p H hd + (r Hs + h) hd + e
//   gathered  (B T, P Hs hd):    row b T + r T/sp + t, column p Hs hd + h hd + e
//   staging   [r][b][t][p][h][e]: what goes to (or came from) rank r, contiguous per rank.
#include <fmt/format.h>

#include "nn/attention.hpp"
#include "nn/gpt.hpp"

namespace tessera::nn {

namespace {

struct Regroup {
  Index batch, seq, sp, parts, hs, hd;  // seq: positions per rank
  /// Index in the local matrix of staging element (r, b, t, p, h, e).
  KOKKOS_INLINE_FUNCTION Index local(Index r, Index b, Index t, Index p, Index h, Index e) const {
    return (b * seq + t) * (parts * sp * hs * hd) + (p * sp * hs + r * hs + h) * hd + e;
  }
  /// Index in the gathered matrix.
  KOKKOS_INLINE_FUNCTION Index gathered(Index r, Index b, Index t, Index p, Index h, Index e) const {
    return (b * seq * sp + r * seq + t) * (parts * hs * hd) + (p * hs + h) * hd + e;
  }
  Index size() const { return sp * batch * seq * parts * hs * hd; }
};

/// Copies between a staging buffer and a matrix (local or gathered): to_staging from the matrix
/// `src` into the staging `dst`, else from the staging `src` into the matrix `dst`. One thread
/// per staging row (r, b, t).
template <class T>
void stage(const ExecSpace& exec, const Regroup& g, const T* src, T* dst, bool gathered, bool to_staging) {
  const Index rows = g.sp * g.batch * g.seq, width = g.parts * g.hs * g.hd;
  Kokkos::parallel_for(
      "tessera::nn::context_regroup", range(exec, rows), KOKKOS_LAMBDA(const Index row) {
        const Index t = row % g.seq, b = (row / g.seq) % g.batch, r = row / (g.seq * g.batch);
        for (Index p = 0; p < g.parts; ++p)
          for (Index h = 0; h < g.hs; ++h) {
            const Index m = gathered ? g.gathered(r, b, t, p, h, 0) : g.local(r, b, t, p, h, 0);
            const Index s = row * width + (p * g.hs + h) * g.hd;
            if (to_staging)
              for (Index e = 0; e < g.hd; ++e) dst[s + e] = src[m + e];
            else
              for (Index e = 0; e < g.hd; ++e) dst[m + e] = src[s + e];
          }
      });
}

}  // namespace

template <class T>
void Gpt<T>::regroup(const ExecSpace& exec, const T* from, T* to, int batch, int parts, bool to_heads) const {
  const Regroup g{Index(batch), Index(seq_), Index(part_.sp), Index(parts), Index(att_heads_), Index(hd_)};
  T* send = cp_send_.data();
  T* recv = cp_recv_.data();
  stage(exec, g, from, send, /*gathered=*/!to_heads, /*to_staging=*/true);
  exec.fence();
  part_.all_to_all(send, recv, std::size_t(g.size() / g.sp));
  stage(exec, g, static_cast<const T*>(recv), to, /*gathered=*/to_heads, /*to_staging=*/false);
}

template <class T>
void Gpt<T>::attend(const ExecSpace& exec, const MatrixU<const T>& qkv, const MatrixU<T>& y, const Acts& a,
                    int batch) const {
  if (ring_) {
    ring_attend(exec, qkv, y, a, batch);
    return;
  }
  const AttentionScores<T> att = batch_scores(a.att, batch);
  if (part_.sp == 1) {
    if constexpr (fused_attention) fused_attention_forward<T>(exec, qkv, y, att, shape_.window);
    else attention_forward<T>(exec, part_.precision, qkv, y, att, shape_.window);
    return;
  }
  // Whole sequences of heads/sp heads: (B T, 3 C/(tp sp)) in a.qkv (backward reads it), y
  // gathered in cp_y_, then back to the positions.
  const std::size_t whole = std::size_t(batch) * std::size_t(shape_.context);
  const std::size_t width = std::size_t(att_heads_) * std::size_t(hd_);
  const MatrixU<T> gathered(a.qkv.data(), whole, 3 * width), yg(cp_y_.data(), whole, width);
  regroup(exec, qkv.data(), gathered.data(), batch, 3, /*to_heads=*/true);
  attention_forward<T>(exec, part_.precision, MatrixU<const T>(gathered), yg, att, shape_.window);
  regroup(exec, yg.data(), y.data(), batch, 1, /*to_heads=*/false);
}

template <class T>
void Gpt<T>::attend_backward(const ExecSpace& exec, const Acts& a, const MatrixU<const T>& dy, const MatrixU<T>& dqkv,
                             int batch) const {
  if (ring_) {
    ring_attend_backward(exec, a, dy, dqkv, batch);
    return;
  }
  const AttentionScores<T> att = batch_scores(a.att, batch), ds = batch_scores(dscores_, batch);
  const std::size_t tokens = std::size_t(batch) * std::size_t(seq_);
  if (part_.sp == 1) {
    const MatrixU<const T> qkv = first_rows(a.qkv, tokens);
    if constexpr (fused_attention) fused_attention_backward<T>(exec, qkv, att, dy, dqkv, ds, shape_.window);
    else attention_backward<T>(exec, part_.precision, qkv, att, dy, dqkv, ds, shape_.window);
    return;
  }
  const std::size_t whole = std::size_t(batch) * std::size_t(shape_.context);
  const std::size_t width = std::size_t(att_heads_) * std::size_t(hd_);
  const MatrixU<const T> gathered(a.qkv.data(), whole, 3 * width);
  const MatrixU<T> dyg(cp_y_.data(), whole, width), dg(cp_qkv_.data(), whole, 3 * width);
  regroup(exec, dy.data(), dyg.data(), batch, 1, /*to_heads=*/true);
  attention_backward<T>(exec, part_.precision, gathered, att, MatrixU<const T>(dyg), dg, ds, shape_.window);
  regroup(exec, dg.data(), dqkv.data(), batch, 3, /*to_heads=*/false);
}

#define TESSERA_CONTEXT_PARALLEL(T)                                                                                 \
  template void Gpt<T>::regroup(const ExecSpace&, const T*, T*, int, int, bool) const;                             \
  template void Gpt<T>::attend(const ExecSpace&, const MatrixU<const T>&, const MatrixU<T>&, const Acts&, int)     \
      const;                                                                                                        \
  template void Gpt<T>::attend_backward(const ExecSpace&, const Acts&, const MatrixU<const T>&, const MatrixU<T>&, \
                                        int) const;
TESSERA_CONTEXT_PARALLEL(float)
TESSERA_CONTEXT_PARALLEL(double)
#undef TESSERA_CONTEXT_PARALLEL

}  // namespace tessera::nn
