// The transformers' attention under context parallelism by a ring (parallel.spatial = C > 1,
// parallel.context_comm = "ring"): ring attention with causal load balancing.
//
// Each rank of a context group holds two chunks of c = T/(2C) positions of every sequence: rank s
// the head chunk s and the tail chunk 2C-1-s (Gpt::pos_), so every rank has the same causal work.
// Its queries stay; the keys and values (only the key/value heads: a llama's shared heads are not
// repeated on the wire) travel around the ring: at step k = 0..C-1 rank s holds the block of rank
// s - k (mod C), started towards rank s + 1 before the step's products so that the transfer runs
// behind them. A query chunk i sees a key chunk j < i whole, j = i causally, j > i not at all: at
// every step but the first, two of the four chunk pairs are live on every rank.
//
// Forward keeps the softmax online (no T x T matrix): per query row the running maximum m and sum
// l; a step's live scores S = scale Q K^T give m' = max(m, max S), the output y is rescaled by
// exp(m - m') and gets exp(S - m') V, l likewise. At the end y /= l and att keeps each row's
// log-sum-exp m + log l (B, heads, T/C, 1), all backward needs besides q, k, v, y.
//
// Backward recomputes each step's probabilities P = exp(S - lse) and, with D = rowsum(dy * y),
// dS = P (dy V^T - D): dQ += scale dS K stays, dV += P^T dy and dK += scale dS^T Q accumulate in
// gradient buffers that travel with their keys and values and come home after C hops. The keys
// and values of the next step are in flight during a step's products; the gradients leave after it.
//
// Bytes each rank sends per block and micro-batch, with E = B (T/C) 2 h_kv hd elements (keys and
// values): forward (C-1) E, backward (C-1) E + C E.
//
// Layouts: qkv (B T/C, 3 H hd) as the projection wrote it (heads of hd within q, k, v; under GQA
// k and v repeated per query head); a block of keys and values (B T/C, 2 G hd): row b T/C + t,
// K of key/value head g at g hd, V at (G + g) hd; ring_s_ and ring_ds_ (B H T/C, T/C): row
// (b H + h) T/C + i, query i against key j of the block.
#include <fmt/format.h>

#include <array>
#include <cmath>
#include <limits>
#include <vector>

#include "blas/gemm.hpp"
#include "kernels/math.hpp"
#include "nn/gpt.hpp"

namespace tessera::nn {

namespace {

/// One rank's view of a step: the sizes, where its chunks and the block's chunks sit.
struct Ring {
  Index batch, n, c, heads, kv_heads, hd;
  Index q_chunk[2];   // the chunk index (of 2C) of this rank's head and tail rows
  Index kv_chunk[2];  // those of the block of keys and values at this step
  /// Whether query chunk a sees key chunk k of the block: 0 no, 1 whole, 2 causally (the diagonal).
  KOKKOS_INLINE_FUNCTION int live(int a, int k) const {
    return kv_chunk[k] < q_chunk[a] ? 1 : kv_chunk[k] == q_chunk[a] ? 2 : 0;
  }
  Index q_cols() const { return 3 * heads * hd; }
  Index kv_cols() const { return 2 * kv_heads * hd; }
};

Ring ring_of(int batch, int seq, int heads, int kv_heads, int hd, int sp, int s, int step) {
  Ring g{Index(batch), Index(seq), Index(seq / 2), Index(heads), Index(kv_heads), Index(hd), {}, {}};
  const int src = ((s - step) % sp + sp) % sp;
  g.q_chunk[0] = s;
  g.q_chunk[1] = 2 * sp - 1 - s;
  g.kv_chunk[0] = src;
  g.kv_chunk[1] = 2 * sp - 1 - src;
  return g;
}

/// Keys and values of the key/value heads from qkv (every query head's, repeated under GQA: the
/// first of each group is read) into a block.
template <class T>
void pack(const ExecSpace& exec, const Ring& g, const T* qkv, T* kv) {
  const Index rep = g.heads / g.kv_heads, hd = g.hd, G = g.kv_heads, qc = g.q_cols(), kc = g.kv_cols(),
              width = g.heads * hd;
  Kokkos::parallel_for(
      "tessera::nn::ring_pack", range(exec, g.batch * g.n), KOKKOS_LAMBDA(const Index row) {
        for (Index kg = 0; kg < G; ++kg)
          for (Index e = 0; e < hd; ++e) {
            kv[row * kc + kg * hd + e] = qkv[row * qc + width + kg * rep * hd + e];
            kv[row * kc + (G + kg) * hd + e] = qkv[row * qc + 2 * width + kg * rep * hd + e];
          }
      });
}

template <class T>
void zero(const ExecSpace& exec, T* p, std::size_t n) {
  Kokkos::deep_copy(exec, Kokkos::View<T*, MemSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>>(p, n), T(0));
}

/// The step's products over every live chunk pair (query chunk a, key chunk k) of every sample
/// and head: f(b, h, a, k) issues them.
template <class F>
void each_live_pair(const Ring& g, F&& f) {
  for (Index b = 0; b < g.batch; ++b)
    for (Index h = 0; h < g.heads; ++h)
      for (int a = 0; a < 2; ++a)
        for (int k = 0; k < 2; ++k)
          if (g.live(a, k) != 0) f(b, h, a, k);
}

}  // namespace

template <class T>
void Gpt<T>::ring_attend(const ExecSpace& exec, const MatrixU<const T>& qkv, const MatrixU<T>& y, const Acts& a,
                         int batch) const {
  const int sp = part_.sp, s = part_.s;
  const Ring g0 = ring_of(batch, seq_, heads_local_, ring_kv_heads(), hd_, sp, s, 0);
  const Index n = g0.n, c = g0.c, hd = g0.hd, H = g0.heads, rep = H / g0.kv_heads, qc = g0.q_cols(),
              kc = g0.kv_cols(), ldy = Index(y.stride_0());
  const std::size_t block = std::size_t(batch) * std::size_t(n) * std::size_t(kc);
  T* kv[2] = {ring_kv_.data(), ring_kv_.data() + block};
  T* S = ring_s_.data();
  T* m = a.att.data();      // (B, H, n, 1): the running maximum, then the log-sum-exp
  T* l = dscores_.data();   // the running sum (dscores_ is free until backward)
  T* yd = y.data();
  const T scale = T(1) / math::sqrt(T(hd));
  const Precision p = part_.precision;
  pack(exec, g0, qkv.data(), kv[0]);
  for (int step = 0; step < sp; ++step) {
    const Ring g = ring_of(batch, seq_, heads_local_, ring_kv_heads(), hd_, sp, s, step);
    T* cur = kv[step % 2];
    const bool more = step + 1 < sp;
    if (more) {  // the next block in flight while this one's products run
      exec.fence();
      const std::array<ContextMessage<T>, 2> msgs{ContextMessage<T>{cur, block, (s + 1) % sp, true},
                                                  ContextMessage<T>{kv[(step + 1) % 2], block, (s + sp - 1) % sp, false}};
      part_.messages(msgs);
    }
    // S = scale Q K^T for the live pairs.
    each_live_pair(g, [&](Index b, Index h, int ac, int kc_) {
      const T* q = qkv.data() + (b * n + ac * c) * qc + h * hd;
      const T* k = cur + (b * n + kc_ * c) * kc + (h / rep) * hd;
      T* out = S + ((b * H + h) * n + ac * c) * n + kc_ * c;
      blas::matmul(exec, p, blas::Op::N, blas::Op::T, int(c), int(c), int(hd), scale, q, int(qc), k, int(kc), T(0),
                   out, int(n));
    });
    // Online softmax: the new maximum, the probabilities, y and l rescaled.
    const bool first = step == 0;
    Kokkos::parallel_for(
        "tessera::nn::ring_softmax", range(exec, Index(batch) * H * n), KOKKOS_LAMBDA(const Index row) {
          const Index i = row % n, bh = row / n, h = bh % H, b = bh / H;
          const int ac = int(i / c);
          const Index ti = i % c;
          T* srow = S + row * n;
          T mx = first ? -std::numeric_limits<T>::infinity() : m[row];
          const T m_old = mx;
          for (int kc_ = 0; kc_ < 2; ++kc_) {
            const int lv = g.live(ac, kc_);
            const Index lim = lv == 2 ? ti + 1 : lv == 1 ? c : 0;
            for (Index j = 0; j < lim; ++j) mx = srow[kc_ * c + j] > mx ? srow[kc_ * c + j] : mx;
          }
          T sum = T(0);
          for (int kc_ = 0; kc_ < 2; ++kc_) {
            const int lv = g.live(ac, kc_);
            if (lv == 0) continue;
            const Index lim = lv == 2 ? ti + 1 : c;
            T* pr = srow + kc_ * c;
            for (Index j = 0; j < lim; ++j) {
              pr[j] = math::vexp(pr[j] - mx);
              sum += pr[j];
            }
            for (Index j = lim; j < c; ++j) pr[j] = T(0);
          }
          T* yr = yd + (b * n + i) * ldy + h * hd;
          if (first) {
            for (Index e = 0; e < hd; ++e) yr[e] = T(0);
            l[row] = sum;
          } else {
            const T alpha = math::vexp(m_old - mx);
            for (Index e = 0; e < hd; ++e) yr[e] *= alpha;
            l[row] = l[row] * alpha + sum;
          }
          m[row] = mx;
        });
    // y += P V for the live pairs.
    each_live_pair(g, [&](Index b, Index h, int ac, int kc_) {
      const T* pr = S + ((b * H + h) * n + ac * c) * n + kc_ * c;
      const T* v = cur + (b * n + kc_ * c) * kc + (g.kv_heads + h / rep) * hd;
      T* out = yd + (b * n + ac * c) * ldy + h * hd;
      blas::matmul(exec, p, blas::Op::N, blas::Op::N, int(c), int(hd), int(c), T(1), pr, int(n), v, int(kc), T(1),
                   out, int(ldy));
    });
    if (more) part_.wait();
  }
  Kokkos::parallel_for(
      "tessera::nn::ring_normalise", range(exec, Index(batch) * H * n), KOKKOS_LAMBDA(const Index row) {
        const Index i = row % n, bh = row / n, h = bh % H, b = bh / H;
        T* yr = yd + (b * n + i) * ldy + h * hd;
        const T inv = T(1) / l[row];
        for (Index e = 0; e < hd; ++e) yr[e] *= inv;
        m[row] += math::log(l[row]);
      });
}

template <class T>
void Gpt<T>::ring_attend_backward(const ExecSpace& exec, const Acts& a, const MatrixU<const T>& dy,
                                  const MatrixU<T>& dqkv, int batch) const {
  const int sp = part_.sp, s = part_.s;
  const Ring g0 = ring_of(batch, seq_, heads_local_, ring_kv_heads(), hd_, sp, s, 0);
  const Index n = g0.n, c = g0.c, hd = g0.hd, H = g0.heads, G = g0.kv_heads, rep = H / G, qc = g0.q_cols(),
              kc = g0.kv_cols(), ldy = Index(dy.stride_0()), width = H * hd;
  const std::size_t tokens = std::size_t(batch) * std::size_t(n);
  const std::size_t block = tokens * std::size_t(kc);
  const T* qkv = a.qkv.data();
  const T* yv = a.y.data();
  const Index ldo = Index(a.y.stride_0());
  const T* dyd = dy.data();
  T* kv[2] = {ring_kv_.data(), ring_kv_.data() + block};
  T* dkv[2] = {ring_dkv_.data(), ring_dkv_.data() + block};
  T* S = ring_s_.data();
  T* dS = ring_ds_.data();
  const T* lse = a.att.data();
  T* D = dscores_.data();
  T* dq = dqkv.data();
  const T scale = T(1) / math::sqrt(T(hd));
  const Precision p = part_.precision;
  // D = rowsum(dy * y) per row and head.
  Kokkos::parallel_for(
      "tessera::nn::ring_backward_dot", range(exec, Index(batch) * H * n), KOKKOS_LAMBDA(const Index row) {
        const Index i = row % n, bh = row / n, h = bh % H, b = bh / H;
        const T* o = yv + (b * n + i) * ldo + h * hd;
        const T* d = dyd + (b * n + i) * ldy + h * hd;
        T sum = T(0);
        for (Index e = 0; e < hd; ++e) sum += o[e] * d[e];
        D[row] = sum;
      });
  zero(exec, dq, tokens * std::size_t(qc));
  zero(exec, dkv[0], block);
  pack(exec, g0, qkv, kv[0]);
  for (int step = 0; step < sp; ++step) {
    const Ring g = ring_of(batch, seq_, heads_local_, ring_kv_heads(), hd_, sp, s, step);
    T* cur = kv[step % 2];
    T* dcur = dkv[step % 2];
    const bool more = step + 1 < sp;
    exec.fence();
    if (more) {  // the next keys and values in flight during the products
      const std::array<ContextMessage<T>, 2> msgs{ContextMessage<T>{cur, block, (s + 1) % sp, true},
                                                  ContextMessage<T>{kv[(step + 1) % 2], block, (s + sp - 1) % sp, false}};
      part_.messages(msgs);
    }
    each_live_pair(g, [&](Index b, Index h, int ac, int kc_) {
      const T* q = qkv + (b * n + ac * c) * qc + h * hd;
      const T* k = cur + (b * n + kc_ * c) * kc + (h / rep) * hd;
      const T* v = cur + (b * n + kc_ * c) * kc + (G + h / rep) * hd;
      const T* d = dyd + (b * n + ac * c) * ldy + h * hd;
      const Index at = ((b * H + h) * n + ac * c) * n + kc_ * c;
      blas::matmul(exec, p, blas::Op::N, blas::Op::T, int(c), int(c), int(hd), scale, q, int(qc), k, int(kc), T(0),
                   S + at, int(n));
      blas::matmul(exec, p, blas::Op::N, blas::Op::T, int(c), int(c), int(hd), T(1), d, int(ldy), v, int(kc), T(0),
                   dS + at, int(n));
    });
    // P = exp(S - lse) and dS = P (dP - D) on the live pairs; zero where masked.
    Kokkos::parallel_for(
        "tessera::nn::ring_softmax_backward", range(exec, Index(batch) * H * n), KOKKOS_LAMBDA(const Index row) {
          const Index i = row % n;
          const int ac = int(i / c);
          const Index ti = i % c;
          for (int kc_ = 0; kc_ < 2; ++kc_) {
            const int lv = g.live(ac, kc_);
            if (lv == 0) continue;
            const Index lim = lv == 2 ? ti + 1 : c;
            T* pr = S + row * n + kc_ * c;
            T* gr = dS + row * n + kc_ * c;
            for (Index j = 0; j < lim; ++j) {
              pr[j] = math::vexp(pr[j] - lse[row]);
              gr[j] = pr[j] * (gr[j] - D[row]);
            }
            for (Index j = lim; j < c; ++j) pr[j] = gr[j] = T(0);
          }
        });
    each_live_pair(g, [&](Index b, Index h, int ac, int kc_) {
      const T* q = qkv + (b * n + ac * c) * qc + h * hd;
      const T* k = cur + (b * n + kc_ * c) * kc + (h / rep) * hd;
      const T* d = dyd + (b * n + ac * c) * ldy + h * hd;
      T* dk = dcur + (b * n + kc_ * c) * kc + (h / rep) * hd;
      T* dv = dcur + (b * n + kc_ * c) * kc + (G + h / rep) * hd;
      T* dqa = dq + (b * n + ac * c) * qc + h * hd;
      const Index at = ((b * H + h) * n + ac * c) * n + kc_ * c;
      blas::matmul(exec, p, blas::Op::T, blas::Op::N, int(c), int(hd), int(c), T(1), S + at, int(n), d, int(ldy),
                   T(1), dv, int(kc));
      blas::matmul(exec, p, blas::Op::N, blas::Op::N, int(c), int(hd), int(c), scale, dS + at, int(n), k, int(kc),
                   T(1), dqa, int(qc));
      blas::matmul(exec, p, blas::Op::T, blas::Op::N, int(c), int(hd), int(c), scale, dS + at, int(n), q, int(qc),
                   T(1), dk, int(kc));
    });
    if (more) part_.wait();
    // The block's gradients go on with it (after the last step: home).
    exec.fence();
    const std::array<ContextMessage<T>, 2> back{ContextMessage<T>{dcur, block, (s + 1) % sp, true},
                                                ContextMessage<T>{dkv[(step + 1) % 2], block, (s + sp - 1) % sp, false}};
    part_.messages(back);
    part_.wait();
  }
  // This rank's own keys' and values' gradients, into the first query head of each group (the
  // caller sums each group's heads: rope_reduce), the others' zero.
  const T* home = dkv[sp % 2];
  Kokkos::parallel_for(
      "tessera::nn::ring_unpack", range(exec, Index(tokens)), KOKKOS_LAMBDA(const Index row) {
        for (Index h = 0; h < H; ++h) {
          const bool lead = h % rep == 0;
          const Index kg = h / rep;
          for (Index e = 0; e < hd; ++e) {
            dq[row * qc + width + h * hd + e] = lead ? home[row * kc + kg * hd + e] : T(0);
            dq[row * qc + 2 * width + h * hd + e] = lead ? home[row * kc + (G + kg) * hd + e] : T(0);
          }
        }
      });
}

#define TESSERA_CONTEXT_RING(T)                                                                                     \
  template void Gpt<T>::ring_attend(const ExecSpace&, const MatrixU<const T>&, const MatrixU<T>&, const Acts&, int) \
      const;                                                                                                        \
  template void Gpt<T>::ring_attend_backward(const ExecSpace&, const Acts&, const MatrixU<const T>&,                \
                                             const MatrixU<T>&, int) const;
TESSERA_CONTEXT_RING(float)
TESSERA_CONTEXT_RING(double)
#undef TESSERA_CONTEXT_RING

}  // namespace tessera::nn
