// The transformers' attention under context parallelism by point-to-point (parallel.spatial =
// C > 1, parallel.context_comm = "ring"): ring attention with causal load balancing, or, with a
// sliding window (model.window = W), a halo of the W - 1 preceding positions.
//
// Ring (full causal attention). Each rank of a context group holds two chunks of c = T/(2C)
// positions of every sequence: rank s the head chunk s and the tail chunk 2C-1-s (Gpt::pos_), so
// every rank has the same causal work. Its queries stay; the keys and values (only the key/value
// heads: a llama's shared heads are not repeated on the wire) travel around the ring: at step
// k = 0..C-1 rank s holds the block of rank s - k (mod C), started towards rank s + 1 before the
// step's products so that the transfer runs behind them.
//
// Halo (a window). Each rank holds one block of n = T/C positions; its queries see keys at most
// W - 1 positions back, so it needs the last min(n, W-1-(d-1) n) positions of each preceding rank
// s - d (d = 1, 2, ...: as many ranks as the window spans, multi-hop). Every rank sends those tails
// straight to the ranks that need them and receives its own halo while it attends to its own
// block; backward receives the halo again and sends the halo's gradients back to their owners.
//
// Both run the same passes: a pass is one block of keys and values (the rank's own, one that came
// around the ring, or a piece of the halo) against the rank's queries, by tiles (the query chunks
// against the block's chunks, each a run of consecutive positions) and, within a tile pair, by
// blocks of query rows, each against only the keys its rows can see (causal, within the window).
// Forward keeps the softmax online (no T x T matrix): per query row the running maximum m and sum
// l; a pass's visible scores S = scale Q K^T give m' = max(m, max S), y is rescaled by exp(m - m')
// and gets exp(S - m') V, l likewise. At the end y /= l and att keeps each row's log-sum-exp
// m + log l (B, heads, T/C, 1), all backward needs besides q, k, v and y. Backward recomputes each
// pass's probabilities P = exp(S - lse) and, with D = rowsum(dy * y), dS = P (dy V^T - D): dQ +=
// scale dS K stays, dV += P^T dy and dK += scale dS^T Q accumulate in gradient buffers that go
// with their keys and values: around the ring (home after C hops, each but the last behind the next
// step's products) or back to the halo's owners.
//
// Bytes each rank sends per block and micro-batch, with E = B 2 h_kv hd elements per position
// (keys and values of the key/value heads): ring, forward (C-1) (T/C) E, backward (2C-1) (T/C) E;
// halo, forward what the following ranks need of its tail, min(W-1, (C-1-s) T/C) positions'
// worth for rank s at most, backward that again plus the gradients of its own halo.
//
// Layouts: qkv (B n, 3 H hd) as the projection wrote it (heads of hd within q, k, v; under GQA k
// and v repeated per query head); a block of keys and values (B rows, 2 G hd): sample b's row t at
// b rows + t, K of key/value head g at g hd, V at (G + g) hd; ring_s_ and ring_ds_ (B H n, n): row
// (b H + h) n + i, query i against key j of the pass's block.
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <vector>

#include "blas/gemm.hpp"
#include "kernels/math.hpp"
#include "kernels/simd.hpp"
#include "nn/gpt.hpp"

namespace tessera::nn {

namespace {

/// Rows [row0, row0 + rows) of a sample (queries, or a block of keys and values) at consecutive
/// positions from pos0.
struct Tile {
  Index row0 = 0, rows = 0, pos0 = 0;
};

/// One pass: the rank's query tiles against a block's key tiles.
struct Pass {
  Index batch = 0, n = 0, heads = 0, kv_heads = 0, hd = 0;
  Index window = 0;   // 0: causal; else a query sees keys at most window - 1 positions back
  Index kv_rows = 0;  // rows per sample of the block
  int nq = 0, nk = 0;
  Tile q[2], k[2];
  /// The keys of tile k a query at position qp sees: [lo, hi) (empty: lo >= hi).
  KOKKOS_INLINE_FUNCTION void visible(const Tile& kt, Index qp, Index& lo, Index& hi) const {
    hi = qp - kt.pos0 + 1;
    hi = hi < 0 ? 0 : hi > kt.rows ? kt.rows : hi;
    lo = window == 0 ? 0 : qp - window + 1 - kt.pos0;
    lo = lo < 0 ? 0 : lo;
  }
  Index q_cols() const { return 3 * heads * hd; }
  Index kv_cols() const { return 2 * kv_heads * hd; }
};

/// A query tile's rows in blocks (long tiles: 32 rows; the 1-rank attention's choice), each with
/// the key range [c0, c1) of tile kt its rows can see: f(r0, r1, c0, c1) in tile-local rows; one
/// block where every row sees the whole key tile (an earlier chunk under the ring).
template <class F>
void each_row_block(const Pass& g, const Tile& qt, const Tile& kt, F&& f) {
  Index lo = 0, hi = 0, last_lo = 0, last_hi = 0;
  g.visible(kt, qt.pos0, lo, hi);
  g.visible(kt, qt.pos0 + qt.rows - 1, last_lo, last_hi);
  if (lo == 0 && hi == kt.rows && last_lo == 0 && last_hi == kt.rows) {  // every row sees every key: one block
    f(Index(0), qt.rows, Index(0), kt.rows);
    return;
  }
  const Index bs = qt.rows >= 64 ? 32 : qt.rows;
  for (Index r0 = 0; r0 < qt.rows; r0 += bs) {
    const Index r1 = std::min(r0 + bs, qt.rows);
    Index lo0 = 0, hi0 = 0, lo1 = 0, hi1 = 0;
    g.visible(kt, qt.pos0 + r0, lo0, hi0);
    g.visible(kt, qt.pos0 + r1 - 1, lo1, hi1);
    const Index c0 = lo0, c1 = hi1;  // positions rise with rows: the union of the rows' ranges
    if (c0 < c1) f(r0, r1, c0, c1);
  }
}

/// Every sample, head, query tile and key tile with its row blocks: f(b, h, qt, kt, r0, r1, c0, c1).
template <class F>
void each_block(const Pass& g, F&& f) {
  for (Index b = 0; b < g.batch; ++b)
    for (Index h = 0; h < g.heads; ++h)
      for (int a = 0; a < g.nq; ++a)
        for (int k = 0; k < g.nk; ++k)
          each_row_block(g, g.q[a], g.k[k], [&](Index r0, Index r1, Index c0, Index c1) {
            f(b, h, g.q[a], g.k[k], r0, r1, c0, c1);
          });
}

/// The query tile of local row i.
KOKKOS_INLINE_FUNCTION const Tile& tile_of(const Pass& g, Index i) {
  return g.nq > 1 && i >= g.q[1].row0 ? g.q[1] : g.q[0];
}

/// Keys and values of the key/value heads from qkv (every query head's, repeated under GQA: the
/// first of each group is read) into a block of n rows per sample.
template <class T>
void pack(const ExecSpace& exec, const Pass& g, const T* qkv, T* kv) {
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

/// The last `rows` of each sample's n rows of a block into (from, when add) a block of `rows`.
template <class T>
void tail(const ExecSpace& exec, Index batch, Index n, Index rows, Index kc, T* block, T* part, bool add) {
  Kokkos::parallel_for(
      "tessera::nn::halo_tail", range(exec, batch * rows), KOKKOS_LAMBDA(const Index r) {
        const Index b = r / rows, t = r % rows;
        T* whole = block + (b * n + n - rows + t) * kc;
        T* piece = part + r * kc;
        for (Index e = 0; e < kc; ++e) {
          if (add) whole[e] += piece[e];
          else piece[e] = whole[e];
        }
      });
}

template <class T>
void zero(const ExecSpace& exec, T* p, std::size_t n) {
  Kokkos::deep_copy(exec, Kokkos::View<T*, MemSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>>(p, n), T(0));
}

/// Forward of one pass: y, m (running maximum) and l (running sum) updated with the block kv;
/// `first`: the first pass (y, m, l start from nothing).
template <class T>
void forward_pass(const ExecSpace& exec, Precision p, const Pass& g, const T* qkv, const T* kv, T* S, T* m, T* l,
                  T* y, Index ldy, bool first) {
  const Index n = g.n, hd = g.hd, H = g.heads, rep = H / g.kv_heads, qc = g.q_cols(), kc = g.kv_cols(),
              kr = g.kv_rows;
  const T scale = T(1) / math::sqrt(T(hd));
  each_block(g, [&](Index b, Index h, const Tile& qt, const Tile& kt, Index r0, Index r1, Index c0, Index c1) {
    const T* q = qkv + (b * n + qt.row0 + r0) * qc + h * hd;
    const T* k = kv + (b * kr + kt.row0 + c0) * kc + (h / rep) * hd;
    T* out = S + ((b * H + h) * n + qt.row0 + r0) * n + kt.row0 + c0;
    blas::matmul(exec, p, blas::Op::N, blas::Op::T, int(r1 - r0), int(c1 - c0), int(hd), scale, q, int(qc), k,
                 int(kc), T(0), out, int(n));
  });
  Kokkos::parallel_for(
      "tessera::nn::ring_softmax", range(exec, g.batch * H * n), KOKKOS_LAMBDA(const Index row) {
        const Index i = row % n, bh = row / n, h = bh % H, b = bh / H;
        const Tile& qt = tile_of(g, i);
        const Index qp = qt.pos0 + i - qt.row0;
        T* srow = S + row * n;
        T mx = first ? -Kokkos::Experimental::infinity<T>::value : m[row];
        const T m_old = mx;
        for (int k = 0; k < g.nk; ++k) {
          Index lo = 0, hi = 0;
          g.visible(g.k[k], qp, lo, hi);
          const T* sr = srow + g.k[k].row0;
          T kmax = mx;
          TESSERA_SIMD_REDUCTION(max : kmax)
          for (Index j = lo; j < hi; ++j) kmax = sr[j] > kmax ? sr[j] : kmax;
          mx = kmax;
        }
        T sum = T(0);
        for (int k = 0; k < g.nk; ++k) {
          Index lo = 0, hi = 0;
          g.visible(g.k[k], qp, lo, hi);
          T* pr = srow + g.k[k].row0;
          const Index rows = g.k[k].rows;
          hi = hi > lo ? hi : lo;
          for (Index j = 0; j < lo; ++j) pr[j] = T(0);
          T part = T(0);
          TESSERA_SIMD_REDUCTION(+ : part)
          for (Index j = lo; j < hi; ++j) {
            pr[j] = math::vexp(pr[j] - mx);
            part += pr[j];
          }
          sum += part;
          for (Index j = hi; j < rows; ++j) pr[j] = T(0);
        }
        T* yr = y + (b * n + i) * ldy + h * hd;
        if (first) {
          for (Index e = 0; e < hd; ++e) yr[e] = T(0);
          l[row] = sum;
        } else if (mx != -Kokkos::Experimental::infinity<T>::value) {
          const T alpha = math::vexp(m_old - mx);
          for (Index e = 0; e < hd; ++e) yr[e] *= alpha;
          l[row] = l[row] * alpha + sum;
        }
        m[row] = mx;
      });
  each_block(g, [&](Index b, Index h, const Tile& qt, const Tile& kt, Index r0, Index r1, Index c0, Index c1) {
    const T* pr = S + ((b * H + h) * n + qt.row0 + r0) * n + kt.row0 + c0;
    const T* v = kv + (b * kr + kt.row0 + c0) * kc + (g.kv_heads + h / rep) * hd;
    T* out = y + (b * n + qt.row0 + r0) * ldy + h * hd;
    blas::matmul(exec, p, blas::Op::N, blas::Op::N, int(r1 - r0), int(hd), int(c1 - c0), T(1), pr, int(n), v,
                 int(kc), T(1), out, int(ldy));
  });
}

/// Backward of one pass: dq (the fused (B n, 3 H hd) matrix's q part) and the block's dkv
/// accumulate.
template <class T>
void backward_pass(const ExecSpace& exec, Precision p, const Pass& g, const T* qkv, const T* kv, T* dkv, T* S,
                   T* dS, const T* lse, const T* D, const T* dy, Index ldy, T* dq) {
  const Index n = g.n, hd = g.hd, H = g.heads, G = g.kv_heads, rep = H / G, qc = g.q_cols(), kc = g.kv_cols(),
              kr = g.kv_rows;
  const T scale = T(1) / math::sqrt(T(hd));
  each_block(g, [&](Index b, Index h, const Tile& qt, const Tile& kt, Index r0, Index r1, Index c0, Index c1) {
    const T* q = qkv + (b * n + qt.row0 + r0) * qc + h * hd;
    const T* k = kv + (b * kr + kt.row0 + c0) * kc + (h / rep) * hd;
    const T* v = kv + (b * kr + kt.row0 + c0) * kc + (G + h / rep) * hd;
    const T* d = dy + (b * n + qt.row0 + r0) * ldy + h * hd;
    const Index at = ((b * H + h) * n + qt.row0 + r0) * n + kt.row0 + c0;
    blas::matmul(exec, p, blas::Op::N, blas::Op::T, int(r1 - r0), int(c1 - c0), int(hd), scale, q, int(qc), k,
                 int(kc), T(0), S + at, int(n));
    blas::matmul(exec, p, blas::Op::N, blas::Op::T, int(r1 - r0), int(c1 - c0), int(hd), T(1), d, int(ldy), v,
                 int(kc), T(0), dS + at, int(n));
  });
  // P = exp(S - lse) and dS = P (dP - D) where visible, zero elsewhere in the tiles.
  Kokkos::parallel_for(
      "tessera::nn::ring_softmax_backward", range(exec, g.batch * H * n), KOKKOS_LAMBDA(const Index row) {
        const Index i = row % n;
        const Tile& qt = tile_of(g, i);
        const Index qp = qt.pos0 + i - qt.row0;
        for (int k = 0; k < g.nk; ++k) {
          Index lo = 0, hi = 0;
          g.visible(g.k[k], qp, lo, hi);
          T* pr = S + row * n + g.k[k].row0;
          T* gr = dS + row * n + g.k[k].row0;
          const Index rows = g.k[k].rows;
          hi = hi > lo ? hi : lo;
          const T m = lse[row], d = D[row];
          for (Index j = 0; j < lo; ++j) pr[j] = gr[j] = T(0);
          TESSERA_SIMD
          for (Index j = lo; j < hi; ++j) {
            pr[j] = math::vexp(pr[j] - m);
            gr[j] = pr[j] * (gr[j] - d);
          }
          for (Index j = hi; j < rows; ++j) pr[j] = gr[j] = T(0);
        }
      });
  each_block(g, [&](Index b, Index h, const Tile& qt, const Tile& kt, Index r0, Index r1, Index c0, Index c1) {
    const T* q = qkv + (b * n + qt.row0 + r0) * qc + h * hd;
    const T* k = kv + (b * kr + kt.row0 + c0) * kc + (h / rep) * hd;
    const T* d = dy + (b * n + qt.row0 + r0) * ldy + h * hd;
    T* dk = dkv + (b * kr + kt.row0 + c0) * kc + (h / rep) * hd;
    T* dv = dkv + (b * kr + kt.row0 + c0) * kc + (G + h / rep) * hd;
    T* dqa = dq + (b * n + qt.row0 + r0) * qc + h * hd;
    const Index at = ((b * H + h) * n + qt.row0 + r0) * n + kt.row0 + c0;
    const int rows = int(r1 - r0), cols = int(c1 - c0);
    blas::matmul(exec, p, blas::Op::T, blas::Op::N, cols, int(hd), rows, T(1), S + at, int(n), d, int(ldy), T(1),
                 dv, int(kc));
    blas::matmul(exec, p, blas::Op::N, blas::Op::N, rows, int(hd), cols, scale, dS + at, int(n), k, int(kc), T(1),
                 dqa, int(qc));
    blas::matmul(exec, p, blas::Op::T, blas::Op::N, cols, int(hd), rows, scale, dS + at, int(n), q, int(qc), T(1),
                 dk, int(kc));
  });
}

/// y /= l per row and head, m += log l (the log-sum-exp).
template <class T>
void normalise(const ExecSpace& exec, Index batch, Index n, Index H, Index hd, T* y, Index ldy, T* m, const T* l) {
  Kokkos::parallel_for(
      "tessera::nn::ring_normalise", range(exec, batch * H * n), KOKKOS_LAMBDA(const Index row) {
        const Index i = row % n, bh = row / n, h = bh % H, b = bh / H;
        T* yr = y + (b * n + i) * ldy + h * hd;
        const T inv = T(1) / l[row];
        for (Index e = 0; e < hd; ++e) yr[e] *= inv;
        m[row] += math::log(l[row]);
      });
}

/// D = rowsum(dy * y) per row and head.
template <class T>
void row_dots(const ExecSpace& exec, Index batch, Index n, Index H, Index hd, const T* y, Index ldo, const T* dy,
              Index ldy, T* D) {
  Kokkos::parallel_for(
      "tessera::nn::ring_backward_dot", range(exec, batch * H * n), KOKKOS_LAMBDA(const Index row) {
        const Index i = row % n, bh = row / n, h = bh % H, b = bh / H;
        const T* o = y + (b * n + i) * ldo + h * hd;
        const T* d = dy + (b * n + i) * ldy + h * hd;
        T sum = T(0);
        for (Index e = 0; e < hd; ++e) sum += o[e] * d[e];
        D[row] = sum;
      });
}

/// out = L (first) or in + L.
template <class T>
void add_blocks(const ExecSpace& exec, Index n, bool first, const T* in, const T* L, T* out) {
  Kokkos::parallel_for(
      "tessera::nn::ring_gradient_sum", range(exec, n),
      KOKKOS_LAMBDA(const Index e) { out[e] = first ? L[e] : in[e] + L[e]; });
}

/// The rank's own keys' and values' gradients (a block) into the k and v parts of dqkv: the first
/// query head of each group (the caller sums each group's heads: rope_reduce), the others zero.
template <class T>
void unpack(const ExecSpace& exec, const Pass& g, const T* home, T* dqkv) {
  const Index H = g.heads, G = g.kv_heads, rep = H / G, hd = g.hd, qc = g.q_cols(), kc = g.kv_cols(),
              width = H * hd;
  Kokkos::parallel_for(
      "tessera::nn::ring_unpack", range(exec, g.batch * g.n), KOKKOS_LAMBDA(const Index row) {
        for (Index h = 0; h < H; ++h) {
          const bool lead = h % rep == 0;
          const Index kg = h / rep;
          for (Index e = 0; e < hd; ++e) {
            dqkv[row * qc + width + h * hd + e] = lead ? home[row * kc + kg * hd + e] : T(0);
            dqkv[row * qc + 2 * width + h * hd + e] = lead ? home[row * kc + (G + kg) * hd + e] : T(0);
          }
        }
      });
}

}  // namespace

template <class T>
int Gpt<T>::halo_from(int d) const {
  // Rank s's queries reach back W - 1 positions: the last min(n, W-1-(d-1) n) of rank s - d.
  if (part_.head_tail || d < 1 || d >= part_.sp) return 0;
  return std::clamp(shape_.window - 1 - (d - 1) * seq_, 0, seq_);
}

template <class T>
int Gpt<T>::halo_positions() const {
  int sum = 0;
  for (int d = 1; d < part_.sp; ++d) sum += halo_from(d);
  return sum;
}

namespace {

/// The rank's own block as a pass: under the ring, its two chunks against the same two; with a
/// window, its block against itself.
Pass own_pass(int batch, int seq, int heads, int kv_heads, int hd, int window, bool head_tail,
              const kernels::Positions& pos) {
  Pass g;
  g.batch = batch;
  g.n = g.kv_rows = seq;
  g.heads = heads;
  g.kv_heads = kv_heads;
  g.hd = hd;
  g.window = window;
  if (head_tail) {  // head and tail chunks
    const Index c = seq / 2;
    g.nq = g.nk = 2;
    g.q[0] = g.k[0] = Tile{0, c, pos(0)};
    g.q[1] = g.k[1] = Tile{c, c, pos(c)};
  } else {
    g.nq = g.nk = 1;
    g.q[0] = g.k[0] = Tile{0, seq, pos(0)};
  }
  return g;
}

/// The ring's pass at `step` on rank s of sp: the own pass with the key chunks of the block that
/// came from rank s - step (its head chunk and its tail chunk).
Pass ring_step(const Pass& own, int s, int sp, int step) {
  Pass g = own;
  const int src = (s - step + sp) % sp;
  const Index c = own.n / 2;
  g.k[0].pos0 = Index(src) * c;
  g.k[1].pos0 = Index(2 * sp - 1 - src) * c;
  return g;
}

}  // namespace

template <class T>
void Gpt<T>::ring_attend(const ExecSpace& exec, const MatrixU<const T>& qkv, const MatrixU<T>& y, const Acts& a,
                         int batch) const {
  const int sp = part_.sp, s = part_.s;
  const Pass own = own_pass(batch, seq_, heads_local_, ring_kv_heads(), hd_, shape_.window, part_.head_tail, pos_);
  const Index kc = own.kv_cols(), ldy = Index(y.stride_0());
  const std::size_t block = std::size_t(batch) * std::size_t(seq_) * std::size_t(kc);
  T* S = ring_s_.data();
  T* m = a.att.data();     // (B, H, n, 1): the running maximum, then the log-sum-exp
  T* l = dscores_.data();  // the running sum (dscores_ is free until backward)
  const Precision p = part_.precision;
  pack(exec, own, qkv.data(), ring_kv_.data());
  if (part_.head_tail) {  // the ring
    T* kv[2] = {ring_kv_.data(), ring_kv_.data() + block};
    for (int step = 0; step < sp; ++step) {
      T* cur = kv[step % 2];
      const bool more = step + 1 < sp;
      if (more) {  // the next block in flight while this one's products run
        exec.fence();
        const std::array<ContextMessage<T>, 2> msgs{
            ContextMessage<T>{cur, block, (s + 1) % sp, true},
            ContextMessage<T>{kv[(step + 1) % 2], block, (s + sp - 1) % sp, false}};
        part_.messages(msgs);
      }
      forward_pass(exec, p, ring_step(own, s, sp, step), qkv.data(), cur, S, m, l, y.data(), ldy, step == 0);
      if (more) part_.wait();
    }
  } else {  // the window's halo: the own block while it arrives, then each piece
    halo_exchange(exec, batch, /*gradients=*/false);
    forward_pass(exec, p, own, qkv.data(), ring_kv_.data(), S, m, l, y.data(), ldy, true);
    part_.wait();
    halo_passes(batch, [&](const Pass& g, T* kv, T*) {
      forward_pass(exec, p, g, qkv.data(), kv, S, m, l, y.data(), ldy, false);
    });
  }
  normalise(exec, Index(batch), Index(seq_), Index(heads_local_), Index(hd_), y.data(), ldy, m, l);
}

template <class T>
template <class F>
void Gpt<T>::halo_passes(int batch, F&& f) const {
  // Piece d of the halo (from rank s - d) in ring_kv_ after the own block, its gradients at the
  // same place in ring_dkv_.
  const Pass own = own_pass(batch, seq_, heads_local_, ring_kv_heads(), hd_, shape_.window, part_.head_tail, pos_);
  const std::size_t kc = std::size_t(own.kv_cols());
  std::size_t at = std::size_t(batch) * std::size_t(seq_) * kc;
  for (int d = 1; d <= part_.s; ++d) {
    const int piece = halo_from(d);
    if (piece == 0) break;
    Pass g = own;
    g.kv_rows = piece;
    g.k[0] = Tile{0, piece, Index(part_.s - d + 1) * seq_ - piece};
    f(g, ring_kv_.data() + at, ring_dkv_.data() + at);
    at += std::size_t(batch) * std::size_t(piece) * kc;
  }
}

template <class T>
void Gpt<T>::halo_exchange(const ExecSpace& exec, int batch, bool gradients) const {
  // Forward (and again in backward): rank s receives piece d from s - d and sends its tail to
  // s + d. gradients: the halo's gradients go back to s - d, and rank s receives those of its
  // tail from s + d (ring_attend_backward adds them to its own).
  const int sp = part_.sp, s = part_.s;
  const std::size_t kc = 2 * std::size_t(ring_kv_heads()) * std::size_t(hd_);
  const std::size_t own = std::size_t(batch) * std::size_t(seq_) * kc;
  const std::size_t halo = std::size_t(batch) * std::size_t(halo_positions()) * kc;
  T* base = gradients ? ring_dkv_.data() : ring_kv_.data();
  std::vector<ContextMessage<T>> msgs;
  std::size_t in = own, out = own + halo;  // received pieces after the own block, staged tails after them
  for (int d = 1; d < sp; ++d) {
    const int piece = halo_from(d);
    if (piece == 0) break;
    const std::size_t count = std::size_t(batch) * std::size_t(piece) * kc;
    if (s - d >= 0) msgs.push_back(ContextMessage<T>{base + in, count, s - d, /*send=*/gradients});
    if (s + d < sp) {
      if (!gradients) tail(exec, batch, seq_, piece, Index(kc), base, base + out, false);
      msgs.push_back(ContextMessage<T>{base + out, count, s + d, /*send=*/!gradients});
    }
    in += count;
    out += count;
  }
  exec.fence();
  part_.messages(msgs);
}

template <class T>
void Gpt<T>::ring_attend_backward(const ExecSpace& exec, const Acts& a, const MatrixU<const T>& dy,
                                  const MatrixU<T>& dqkv, int batch) const {
  const int sp = part_.sp, s = part_.s;
  const Pass own = own_pass(batch, seq_, heads_local_, ring_kv_heads(), hd_, shape_.window, part_.head_tail, pos_);
  const Index n = seq_, hd = hd_, H = heads_local_, qc = own.q_cols(),
              kc = own.kv_cols(), ldy = Index(dy.stride_0());
  const std::size_t tokens = std::size_t(batch) * std::size_t(n);
  const std::size_t block = tokens * std::size_t(kc);
  const T* qkv = a.qkv.data();
  const T* yv = a.y.data();
  const Index ldo = Index(a.y.stride_0());
  const T* dyd = dy.data();
  T* S = ring_s_.data();
  T* dS = ring_ds_.data();
  const T* lse = a.att.data();
  T* D = dscores_.data();
  T* dq = dqkv.data();
  const Precision p = part_.precision;
  // D = rowsum(dy * y) per row and head.
  row_dots(exec, Index(batch), n, H, hd, yv, ldo, dyd, ldy, D);
  zero(exec, dq, tokens * std::size_t(qc));
  pack(exec, own, qkv, ring_kv_.data());
  const T* home = ring_dkv_.data();  // where this rank's own keys' and values' gradients end
  if (part_.head_tail) {  // the ring: the gradients travel with their block and come home
    // Each step's contribution L accumulates alone while the sum so far of the same block comes
    // in from the previous rank; out = in + L leaves with the next step's keys and values, so
    // every hop but the last (home) runs behind a step's products.
    T* kv[2] = {ring_kv_.data(), ring_kv_.data() + block};
    T* L = ring_dkv_.data();
    T* in = L + block;
    T* out = in + block;
    for (int step = 0; step < sp; ++step) {
      T* cur = kv[step % 2];
      const bool more = step + 1 < sp;
      exec.fence();
      std::vector<ContextMessage<T>> msgs;
      if (more) {  // the next keys and values
        msgs.push_back(ContextMessage<T>{cur, block, (s + 1) % sp, true});
        msgs.push_back(ContextMessage<T>{kv[(step + 1) % 2], block, (s + sp - 1) % sp, false});
      }
      if (step > 0) {  // the last step's block's gradients on, this one's so far in
        msgs.push_back(ContextMessage<T>{out, block, (s + 1) % sp, true});
        msgs.push_back(ContextMessage<T>{in, block, (s + sp - 1) % sp, false});
      }
      part_.messages(msgs);
      zero(exec, L, block);
      backward_pass(exec, p, ring_step(own, s, sp, step), qkv, cur, L, S, dS, lse, D, dyd, ldy, dq);
      part_.wait();
      add_blocks(exec, Index(block), step == 0, in, L, out);
    }
    exec.fence();
    const std::array<ContextMessage<T>, 2> last{ContextMessage<T>{out, block, (s + 1) % sp, true},
                                                ContextMessage<T>{in, block, (s + sp - 1) % sp, false}};
    part_.messages(last);
    part_.wait();
    home = in;
  } else {  // the window's halo, received again; its gradients back to their owners
    const std::size_t halo = std::size_t(batch) * std::size_t(halo_positions()) * std::size_t(kc);
    zero(exec, ring_dkv_.data(), block + halo);
    halo_exchange(exec, batch, /*gradients=*/false);
    backward_pass(exec, p, own, qkv, ring_kv_.data(), ring_dkv_.data(), S, dS, lse, D, dyd, ldy, dq);
    part_.wait();
    halo_passes(batch, [&](const Pass& g, T* kv, T* dkv) {
      backward_pass(exec, p, g, qkv, kv, dkv, S, dS, lse, D, dyd, ldy, dq);
    });
    halo_exchange(exec, batch, /*gradients=*/true);
    part_.wait();
    // The gradients of this rank's tail, from each rank that read it, into its own.
    std::size_t at = block + halo;
    for (int d = 1; d < sp && halo_from(d) > 0; ++d) {
      const int piece = halo_from(d);
      if (s + d < sp) tail(exec, batch, n, piece, kc, ring_dkv_.data(), ring_dkv_.data() + at, true);
      at += std::size_t(batch) * std::size_t(piece) * std::size_t(kc);
    }
  }
  // This rank's own keys' and values' gradients, into the first query head of each group (the
  // caller sums each group's heads: rope_reduce), the others' zero.
  unpack(exec, own, home, dq);
}

#define TESSERA_CONTEXT_RING(T)                                                                                     \
  template int Gpt<T>::halo_from(int) const;                                                                        \
  template int Gpt<T>::halo_positions() const;                                                                      \
  template void Gpt<T>::halo_exchange(const ExecSpace&, int, bool) const;                                           \
  template void Gpt<T>::ring_attend(const ExecSpace&, const MatrixU<const T>&, const MatrixU<T>&, const Acts&, int) \
      const;                                                                                                        \
  template void Gpt<T>::ring_attend_backward(const ExecSpace&, const Acts&, const MatrixU<const T>&,                \
                                             const MatrixU<T>&, int) const;
TESSERA_CONTEXT_RING(float)
TESSERA_CONTEXT_RING(double)
#undef TESSERA_CONTEXT_RING

}  // namespace tessera::nn
