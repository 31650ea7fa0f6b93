#include "nn/attention.hpp"

#include <array>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "blas/gemm.hpp"
#include "kernels/attention.hpp"
#include "kernels/math.hpp"
#include "kernels/precision.hpp"
#include "kernels/simd.hpp"

namespace tessera::nn {

namespace {

struct Dims {
  Index batch, heads, seq, channels, hd;
};

/// The dimensions of rows x channels activations against att (B, heads, T, T).
template <class T>
Dims dims_of(Index rows, Index channels, const AttentionScores<T>& att) {
  Dims d{Index(att.extent(0)), Index(att.extent(1)), Index(att.extent(2)), channels, 0};
  if (d.heads < 1 || d.channels % d.heads != 0 || rows != d.batch * d.seq || Index(att.extent(3)) != d.seq)
    throw std::invalid_argument("tessera::nn::attention: expected qkv (B*T, 3C), att (B, heads, T, T)");
  d.hd = d.channels / d.heads;
  return d;
}

template <class T>
Dims dims_of(const MatrixU<const T>& qkv, const AttentionScores<T>& att) {
  return dims_of(Index(qkv.extent(0)), Index(qkv.extent(1)) / 3, att);
}

int checked_window(int window) {
  if (window < 0) throw std::invalid_argument("tessera::nn::attention: a window of " + std::to_string(window));
  return window;
}

/// Where the products find head h of sample b's q (part 0), k (1) or v (2) in the fused (B*T, 3C)
/// matrix, rows of 3C.
template <class T>
struct FusedQkv {
  const T* base;
  Dims d;
  const T* part(Index b, int p, Index h) const { return base + b * d.seq * 3 * d.channels + p * d.channels + h * d.hd; }
  int ld() const { return int(3 * d.channels); }
};
// Causal products in blocks of `bs` rows (queries) or columns (keys), each only as long as the
// mask lets it be: Q K^T, P V and their query-side gradients take rows [r0, r1) against keys
// [0, r1); dV and dK take keys [c0, c1) against queries [c0, T). With 4 blocks that is 5/8 of the
// full products' FLOPs; short sequences stay one block (one GEMM each). Measured on the default
// GPT (T = 128, 2 ranks, AVX-512): blocks of 16 / 32 / 64 / one of 128 gave 17.0k / 17.2k /
// 16.9k / 16.2k tokens/s.
int causal_block(int seq) { return seq >= 64 ? 32 : seq; }

// Under a sliding window of W positions the products skip the keys no row of the block sees:
// rows [r0, r1) take keys [max(0, r0 - W + 1), r1) (band_first, `align` rounding it down to a
// multiple: the bf16 softmax reads whole chunks of 16, and its backward multiplies the masked
// entries of dP by P = 0, which an unwritten NaN would not survive), and keys [c0, c1) are seen by
// queries [c0, min(T, c1 + W - 1)) (band_end). With window 0 (or at least T) both are the causal
// bounds.
int band_first(int r0, int window, int align = 1) {
  return int(kernels::window_first_key(r0, window)) / align * align;
}
int band_end(int c1, int seq, int window) {
  return int(kernels::window_query_end(c1 - 1, seq, window));
}

}  // namespace

namespace {

/// attention_forward on q, k and v from src, its products in `precision`.
template <class T, class Src>
void forward_from(const ExecSpace& exec, Precision precision, const Src& src, const MatrixU<T>& y,
                  const AttentionScores<T>& att, int window) {
  const Dims d = src.d;
  const int lq = src.ld(), seq = int(d.seq), hd = int(d.hd), bs = causal_block(seq);
  const T scale = T(1) / math::sqrt(T(d.hd));
  for (Index b = 0; b < d.batch; ++b)
    for (Index h = 0; h < d.heads; ++h) {
      const auto* q = src.part(b, 0, h);
      const auto* k = src.part(b, 1, h);
      T* s = att.data() + (b * d.heads + h) * d.seq * d.seq;
      for (int r0 = 0; r0 < seq; r0 += bs) {  // S = scale Q K^T, rows [r0, r1) against keys [k0, r1)
        const int r1 = r0 + bs < seq ? r0 + bs : seq, k0 = band_first(r0, window);
        blas::matmul(exec, precision, blas::Op::N, blas::Op::T, r1 - r0, r1 - k0, hd, scale, q + r0 * lq, lq,
                     k + k0 * lq, lq, T(0), s + r0 * seq + k0, seq);
      }
    }
  // Causal softmax of every row in place over keys [lo, i]; zero above the diagonal and left of
  // the window (entries the products did not write).
  const Index rows = d.batch * d.heads * d.seq, n = d.seq, w = window;
  T* base = att.data();
  Kokkos::parallel_for(
      "tessera::nn::attention_forward::softmax", Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<Index>>(exec, 0, rows),
      KOKKOS_LAMBDA(const Index r) {
        T* p = base + r * n;
        const Index i = r % n, lo = kernels::window_first_key(i, w);
        T m = p[lo];
        TESSERA_SIMD_REDUCTION(max : m)
        for (Index j = lo + 1; j <= i; ++j) m = p[j] > m ? p[j] : m;
        T sum = T(0);
        TESSERA_SIMD_REDUCTION(+ : sum)
        for (Index j = lo; j <= i; ++j) {
          p[j] = math::vexp(p[j] - m);
          sum += p[j];
        }
        const T inv = T(1) / sum;
        TESSERA_SIMD
        for (Index j = lo; j <= i; ++j) p[j] *= inv;
        for (Index j = 0; j < lo; ++j) p[j] = T(0);
        for (Index j = i + 1; j < n; ++j) p[j] = T(0);
      });
  const int ldy = int(y.stride_0());
  for (Index b = 0; b < d.batch; ++b)
    for (Index h = 0; h < d.heads; ++h) {
      const auto* v = src.part(b, 2, h);
      const T* p = att.data() + (b * d.heads + h) * d.seq * d.seq;
      T* yb = y.data() + b * d.seq * ldy + h * d.hd;
      for (int r0 = 0; r0 < seq; r0 += bs) {  // Y = P V: rows [r0, r1) of P are zero outside columns [k0, r1)
        const int r1 = r0 + bs < seq ? r0 + bs : seq, k0 = band_first(r0, window);
        blas::matmul(exec, precision, blas::Op::N, blas::Op::N, r1 - r0, hd, r1 - k0, T(1), p + r0 * seq + k0, seq,
                     v + k0 * lq, lq, T(0), yb + r0 * ldy, ldy);
      }
    }
}

/// attention_backward on q, k and v from src, its products in `precision`; dqkv is the fused
/// (B*T, 3C) matrix.
template <class T, class Src>
void backward_from(const ExecSpace& exec, Precision precision, const Src& src, const AttentionScores<T>& att,
                   const MatrixU<const T>& dy, const MatrixU<T>& dqkv, const AttentionScores<T>& dscores,
                   int window) {
  const Dims d = src.d;
  const int ld = int(3 * d.channels), lq = src.ld(), seq = int(d.seq), hd = int(d.hd), ldy = int(dy.stride_0()),
            bs = causal_block(seq);
  const T scale = T(1) / math::sqrt(T(d.hd));
  // dP = dY V^T, and dV = P^T dY.
  for (Index b = 0; b < d.batch; ++b)
    for (Index h = 0; h < d.heads; ++h) {
      const Index off = b * d.seq * ld + h * d.hd;
      const T* dyb = dy.data() + b * d.seq * ldy + h * d.hd;
      const T* p = att.data() + (b * d.heads + h) * d.seq * d.seq;
      T* dp = dscores.data() + (b * d.heads + h) * d.seq * d.seq;
      const auto* v = src.part(b, 2, h);
      T* dv = dqkv.data() + off + 2 * d.channels;
      for (int r0 = 0; r0 < seq; r0 += bs) {  // dP = dY V^T, where P is not masked
        const int r1 = r0 + bs < seq ? r0 + bs : seq, k0 = band_first(r0, window);
        blas::matmul(exec, precision, blas::Op::N, blas::Op::T, r1 - r0, r1 - k0, hd, T(1), dyb + r0 * ldy, ldy,
                     v + k0 * lq, lq, T(0), dp + r0 * seq + k0, seq);
      }
      for (int c0 = 0; c0 < seq; c0 += bs) {  // dV = P^T dY: keys [c0, c1) are seen by queries [c0, e)
        const int c1 = c0 + bs < seq ? c0 + bs : seq, e = band_end(c1, seq, window);
        blas::matmul(exec, precision, blas::Op::T, blas::Op::N, c1 - c0, hd, e - c0, T(1), p + c0 * seq + c0,
                     seq, dyb + c0 * ldy, ldy, T(0), dv + c0 * ld, ld);
      }
    }
  // dS = P (dP - rowsum(P dP)), in place of dP; zero above the diagonal and left of the window.
  const Index rows = d.batch * d.heads * d.seq, n = d.seq, w = window;
  const T* pb = att.data();
  T* db = dscores.data();
  Kokkos::parallel_for(
      "tessera::nn::attention_backward::softmax", Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<Index>>(exec, 0, rows),
      KOKKOS_LAMBDA(const Index r) {
        const T* p = pb + r * n;
        T* g = db + r * n;
        const Index i = r % n, lo = kernels::window_first_key(i, w);
        T dot = T(0);
        TESSERA_SIMD_REDUCTION(+ : dot)
        for (Index j = lo; j <= i; ++j) dot += p[j] * g[j];
        TESSERA_SIMD
        for (Index j = lo; j <= i; ++j) g[j] = p[j] * (g[j] - dot);
        for (Index j = 0; j < lo; ++j) g[j] = T(0);
        for (Index j = i + 1; j < n; ++j) g[j] = T(0);
      });
  // dQ = scale dS K, dK = scale dS^T Q.
  for (Index b = 0; b < d.batch; ++b)
    for (Index h = 0; h < d.heads; ++h) {
      const Index off = b * d.seq * ld + h * d.hd;
      const T* ds = dscores.data() + (b * d.heads + h) * d.seq * d.seq;
      const auto* q = src.part(b, 0, h);
      const auto* k = src.part(b, 1, h);
      T* dq = dqkv.data() + off;
      T* dk = dq + d.channels;
      for (int r0 = 0; r0 < seq; r0 += bs) {  // dQ = scale dS K
        const int r1 = r0 + bs < seq ? r0 + bs : seq, k0 = band_first(r0, window);
        blas::matmul(exec, precision, blas::Op::N, blas::Op::N, r1 - r0, hd, r1 - k0, scale, ds + r0 * seq + k0, seq,
                     k + k0 * lq, lq, T(0), dq + r0 * ld, ld);
      }
      for (int c0 = 0; c0 < seq; c0 += bs) {  // dK = scale dS^T Q
        const int c1 = c0 + bs < seq ? c0 + bs : seq, e = band_end(c1, seq, window);
        blas::matmul(exec, precision, blas::Op::T, blas::Op::N, c1 - c0, hd, e - c0, scale, ds + c0 * seq + c0,
                     seq, q + c0 * lq, lq, T(0), dk + c0 * ld, ld);
      }
    }
}

}  // namespace

template <class T>
void attention_forward(const ExecSpace& exec, Precision p, const MatrixU<const T>& qkv, const MatrixU<T>& y,
                       const AttentionScores<T>& att, int window) {
  forward_from(exec, p, FusedQkv<T>{qkv.data(), dims_of(qkv, att)}, y, att, checked_window(window));
}

template <class T>
void attention_backward(const ExecSpace& exec, Precision p, const MatrixU<const T>& qkv,
                        const AttentionScores<T>& att, const MatrixU<const T>& dy,
                        const MatrixU<T>& dqkv, const AttentionScores<T>& dscores, int window) {
  backward_from(exec, p, FusedQkv<T>{qkv.data(), dims_of(qkv, att)}, att, dy, dqkv, dscores, checked_window(window));
}

namespace {

/// Where the batched products of the bf16 attention find their operands: item (b, h) of each
/// (the Batch's outer and inner index) and the strides between items.
struct Bf16Layout {
  Dims d;
  std::int64_t ldy, ldq;  // row strides of y / dy (B*T, C) and dqkv (B*T, 3C)

  blas::Batch batch(std::array<std::int64_t, 2> a, std::array<std::int64_t, 2> b,
                    std::array<std::int64_t, 2> c) const {
    return blas::Batch{int(d.batch), int(d.heads), {a[0], a[1]}, {b[0], b[1]}, {c[0], c[1]}};
  }
  /// qkv_to_bf16's head blocks (T x hd, rows of hd): part p of item (b, h) at ((b*3 + p)*H + h)*T*hd.
  std::array<std::int64_t, 2> heads() const { return {3 * d.heads * d.seq * d.hd, d.seq * d.hd}; }
  std::int64_t part(int p) const { return std::int64_t{p} * d.heads * d.seq * d.hd; }
  /// The (B, H, T, T) scores and probabilities.
  std::array<std::int64_t, 2> scores() const { return {d.heads * d.seq * d.seq, d.seq * d.seq}; }
  /// y and dy: head h of sample b at b*T*ldy + h*hd.
  std::array<std::int64_t, 2> rows_y() const { return {d.seq * ldy, d.hd}; }
  /// dqkv: the same in rows of 3C.
  std::array<std::int64_t, 2> rows_q() const { return {d.seq * ldq, d.hd}; }
};

/// Where the bf16 softmax of row i (of n keys) stops: the causal length i + 1 rounded up to whole
/// chunks of 16, or n. The entries past i that it reads were computed by the products of i's
/// causal block (a multiple of 16 long, or n), and are masked out.
KOKKOS_INLINE_FUNCTION Index masked_end(Index i, Index n) {
  const Index end = (i + 16) / 16 * 16;
  return end < n ? end : n;
}

/// Where it starts: the window's first key rounded down to a multiple of 16 (0 without a window).
/// The products of i's block computed the entries from there on (band_first with align 16), and
/// those before the window are masked out.
constexpr int bf16_chunk = 16;
KOKKOS_INLINE_FUNCTION Index masked_begin(Index i, Index window) {
  return kernels::window_first_key(i, window) / bf16_chunk * bf16_chunk;
}

// f(j) for j in [0, end) as chunks of 16 lanes, each a fixed-length loop that the compiler turns
// into whole vectors of floats (a loop over 16-bit data to an end it cannot see runs 32 lanes with
// scalar tails, which cost more than the vectors in rows this short), then the rest one by one.
// The sum and the maximum keep one partial per lane, combined at the end in lane order.
constexpr int lanes = 16;
/// The longest row (keys) whose exponentials the bf16 softmax keeps on the stack (2 KB).
constexpr Index exps_kept = 512;

template <class F>
KOKKOS_INLINE_FUNCTION void each_in_chunks(Index end, const F& f) {
  const Index full = end / lanes * lanes;
  for (Index c = 0; c < full; c += lanes) {
    TESSERA_SIMD
    for (int k = 0; k < lanes; ++k) f(c + k);
  }
  for (Index j = full; j < end; ++j) f(j);
}

template <class F>
KOKKOS_INLINE_FUNCTION float sum_in_chunks(Index end, const F& f) {
  float part[lanes] = {};
  const Index full = end / lanes * lanes;
  for (Index c = 0; c < full; c += lanes) {
    TESSERA_SIMD
    for (int k = 0; k < lanes; ++k) part[k] += f(c + k);
  }
  float sum = 0.0f;
  for (Index j = full; j < end; ++j) sum += f(j);
  for (int k = 0; k < lanes; ++k) sum += part[k];
  return sum;
}

template <class F>
KOKKOS_INLINE_FUNCTION float max_in_chunks(Index end, float lowest, const F& f) {
  float part[lanes];
  for (int k = 0; k < lanes; ++k) part[k] = lowest;
  const Index full = end / lanes * lanes;
  for (Index c = 0; c < full; c += lanes) {
    TESSERA_SIMD
    for (int k = 0; k < lanes; ++k) {
      const float v = f(c + k);
      part[k] = v > part[k] ? v : part[k];
    }
  }
  float m = lowest;
  for (Index j = full; j < end; ++j) {
    const float v = f(j);
    m = v > m ? v : m;
  }
  for (int k = 0; k < lanes; ++k) m = part[k] > m ? part[k] : m;
  return m;
}

}  // namespace

namespace {

/// qkv_to_bf16 for qkv of element type E (float: rounded to bf16; bf16: copied).
template <class E>
void qkv_heads(const ExecSpace& exec, const MatrixU<const E>& qkv, int heads, int seq, std::uint16_t* out) {
  const Index rows = Index(qkv.extent(0)), c = Index(qkv.extent(1)) / 3, H = heads, T = seq;
  if (H < 1 || T < 1 || Index(qkv.extent(1)) != 3 * c || c % H != 0 || rows % T != 0)
    throw std::invalid_argument("tessera::nn::qkv_to_bf16: expected qkv (B*T, 3C) with C divisible by heads");
  const Index hd = c / H;
  Kokkos::parallel_for(
      "tessera::nn::qkv_to_bf16", range(exec, rows), KOKKOS_LAMBDA(const Index r) {
        const Index b = r / T, t = r % T;
        for (Index p = 0; p < 3; ++p)
          for (Index h = 0; h < H; ++h) {
            const E* in = &qkv(r, p * c + h * hd);
            std::uint16_t* o = out + ((b * 3 + p) * H + h) * T * hd + t * hd;
            if constexpr (std::is_same_v<E, std::uint16_t>) {
              for (Index e = 0; e < hd; ++e) o[e] = in[e];
            } else {
              TESSERA_SIMD
              for (Index e = 0; e < hd; ++e) o[e] = kernels::to_bf16_bits(in[e]);
            }
          }
      });
}

}  // namespace

void qkv_to_bf16(const ExecSpace& exec, const MatrixU<const float>& qkv, int heads, int seq, std::uint16_t* out) {
  qkv_heads(exec, qkv, heads, seq, out);
}

void qkv_to_bf16(const ExecSpace& exec, const MatrixU<const std::uint16_t>& qkv, int heads, int seq,
                 std::uint16_t* out) {
  qkv_heads(exec, qkv, heads, seq, out);
}

void attention_forward_bf16(const ExecSpace& exec, const std::uint16_t* qkv16, const MatrixU<std::uint16_t>& y16,
                            const AttentionScores<std::uint16_t>& att16, int window) {
  const Bf16Layout l{dims_of(Index(y16.extent(0)), Index(y16.extent(1)), att16), std::int64_t(y16.stride_0()), 0};
  const int seq = int(l.d.seq), hd = int(l.d.hd), bs = causal_block(seq), ldy = int(l.ldy), w = checked_window(window);
  const float scale = 1.0f / math::sqrt(float(hd));
  std::uint16_t* s = att16.data();
  for (int r0 = 0; r0 < seq; r0 += bs) {  // S = scale Q K^T, rows [r0, r1) against keys [k0, r1)
    const int r1 = r0 + bs < seq ? r0 + bs : seq, k0 = band_first(r0, w, bf16_chunk);
    blas::matmul_batched(exec, Precision::bf16, blas::Op::N, blas::Op::T, r1 - r0, r1 - k0, hd, scale,
                         qkv16 + l.part(0) + r0 * hd, hd, qkv16 + l.part(1) + k0 * hd, hd, s + r0 * seq + k0, seq,
                         l.batch(l.heads(), l.heads(), l.scores()));
  }
  // Causal softmax of every row in place, fp32 arithmetic on the bf16 scores; zero above the
  // diagonal and left of the window; each probability rounded to bf16 once. The row is read in
  // chunks of 16 from masked_begin to masked_end. A row's exponentials are kept in fp32 on the
  // stack between the sum and the output where the row fits (up to exps_kept keys), else computed
  // again for the output (the same values).
  const Index rows = l.d.batch * l.d.heads * l.d.seq, n = l.d.seq, wn = w;
  Kokkos::parallel_for(
      "tessera::nn::attention_forward_bf16::softmax", range(exec, rows), KOKKOS_LAMBDA(const Index r) {
        const Index i = r % n, begin = masked_begin(i, wn), end = masked_end(i, n) - begin;
        const Index lo = kernels::window_first_key(i, wn) - begin, last = i - begin;
        std::uint16_t* row = s + r * n;
        std::uint16_t* p = row + begin;  // p[j]: key begin + j
        // keep: 1 in the window (lo to the diagonal), 0 outside it. Outside it the exponent is
        // clamped to <= 0 (a no-op inside, where m is the maximum), so masked entries stay finite.
        const float lowest = -3.4028235e38f;
        const auto keep = [&](Index j) { return float(j >= lo && j <= last); };
        const float m = max_in_chunks(end, lowest, [&](Index j) {
          const float k = keep(j);
          return kernels::from_bf16_bits(p[j]) * k + lowest * (1.0f - k);
        });
        const auto e = [&](Index j) {
          const float x = kernels::from_bf16_bits(p[j]) - m;
          return math::vexp(x < 0.0f ? x : 0.0f) * keep(j);
        };
        if (end <= exps_kept) {
          float kept[exps_kept];
          const float inv = 1.0f / sum_in_chunks(end, [&](Index j) { return kept[j] = e(j); });
          each_in_chunks(end, [&](Index j) { p[j] = kernels::to_bf16_bits(kept[j] * inv); });
        } else {
          const float inv = 1.0f / sum_in_chunks(end, e);
          each_in_chunks(end, [&](Index j) { p[j] = kernels::to_bf16_bits(e(j) * inv); });
        }
        for (Index j = 0; j < begin; ++j) row[j] = 0;
        for (Index j = begin + end; j < n; ++j) row[j] = 0;
      });
  for (int r0 = 0; r0 < seq; r0 += bs) {  // Y = P V: rows [r0, r1) of P are zero outside columns [k0, r1)
    const int r1 = r0 + bs < seq ? r0 + bs : seq, k0 = band_first(r0, w, bf16_chunk);
    blas::matmul_batched(exec, Precision::bf16, blas::Op::N, blas::Op::N, r1 - r0, hd, r1 - k0, 1.0f,
                         s + r0 * seq + k0, seq, qkv16 + l.part(2) + k0 * hd, hd, y16.data() + r0 * ldy, ldy,
                         l.batch(l.scores(), l.heads(), l.rows_y()));
  }
}

void attention_backward_bf16(const ExecSpace& exec, const std::uint16_t* qkv16,
                             const AttentionScores<std::uint16_t>& att16, const MatrixU<const std::uint16_t>& dy16,
                             const MatrixU<std::uint16_t>& dqkv16, const AttentionScores<std::uint16_t>& ds16,
                             int window) {
  const Bf16Layout l{dims_of(Index(dqkv16.extent(0)), Index(dqkv16.extent(1)) / 3, att16),
                     std::int64_t(dy16.stride_0()), std::int64_t(dqkv16.stride_0())};
  if (Index(dy16.extent(0)) != Index(dqkv16.extent(0)) || Index(dy16.extent(1)) != l.d.channels)
    throw std::invalid_argument("tessera::nn::attention_backward_bf16: expected dy (B*T, C) beside dqkv (B*T, 3C)");
  const int seq = int(l.d.seq), hd = int(l.d.hd), bs = causal_block(seq), ldy = int(l.ldy), ldq = int(l.ldq),
            C = int(l.d.channels), w = checked_window(window);
  const float scale = 1.0f / math::sqrt(float(hd));
  const std::uint16_t* p = att16.data();
  const std::uint16_t* dy = dy16.data();
  std::uint16_t* ds = ds16.data();
  std::uint16_t* dq = dqkv16.data();
  for (int r0 = 0; r0 < seq; r0 += bs) {  // dP = dY V^T, where P is not masked
    const int r1 = r0 + bs < seq ? r0 + bs : seq, k0 = band_first(r0, w, bf16_chunk);
    blas::matmul_batched(exec, Precision::bf16, blas::Op::N, blas::Op::T, r1 - r0, r1 - k0, hd, 1.0f, dy + r0 * ldy,
                         ldy, qkv16 + l.part(2) + k0 * hd, hd, ds + r0 * seq + k0, seq,
                         l.batch(l.rows_y(), l.heads(), l.scores()));
  }
  for (int c0 = 0; c0 < seq; c0 += bs) {  // dV = P^T dY: keys [c0, c1) are seen by queries [c0, e)
    const int c1 = c0 + bs < seq ? c0 + bs : seq, e = band_end(c1, seq, w);
    blas::matmul_batched(exec, Precision::bf16, blas::Op::T, blas::Op::N, c1 - c0, hd, e - c0, 1.0f,
                         p + c0 * seq + c0, seq, dy + c0 * ldy, ldy, dq + 2 * C + c0 * ldq, ldq,
                         l.batch(l.scores(), l.rows_y(), l.rows_q()));
  }
  // dS = P (dP - rowsum(P dP)) in place of dP, fp32 arithmetic; zero above the diagonal and left
  // of the window.
  const Index rows = l.d.batch * l.d.heads * l.d.seq, n = l.d.seq, wn = w;
  Kokkos::parallel_for(
      "tessera::nn::attention_backward_bf16::softmax", range(exec, rows), KOKKOS_LAMBDA(const Index r) {
        const Index i = r % n, begin = masked_begin(i, wn), end = masked_end(i, n) - begin;
        const std::uint16_t* pr = p + r * n + begin;  // pr[j], g[j]: key begin + j
        std::uint16_t* row = ds + r * n;
        std::uint16_t* g = row + begin;
        // Outside the window P is zero, so those entries add nothing to the sum and come out zero.
        const float dot = sum_in_chunks(
            end, [&](Index j) { return kernels::from_bf16_bits(pr[j]) * kernels::from_bf16_bits(g[j]); });
        each_in_chunks(end, [&](Index j) {
          g[j] = kernels::to_bf16_bits(kernels::from_bf16_bits(pr[j]) * (kernels::from_bf16_bits(g[j]) - dot));
        });
        for (Index j = 0; j < begin; ++j) row[j] = 0;
        for (Index j = begin + end; j < n; ++j) row[j] = 0;
      });
  for (int r0 = 0; r0 < seq; r0 += bs) {  // dQ = scale dS K
    const int r1 = r0 + bs < seq ? r0 + bs : seq, k0 = band_first(r0, w, bf16_chunk);
    blas::matmul_batched(exec, Precision::bf16, blas::Op::N, blas::Op::N, r1 - r0, hd, r1 - k0, scale,
                         ds + r0 * seq + k0, seq, qkv16 + l.part(1) + k0 * hd, hd, dq + r0 * ldq, ldq,
                         l.batch(l.scores(), l.heads(), l.rows_q()));
  }
  for (int c0 = 0; c0 < seq; c0 += bs) {  // dK = scale dS^T Q
    const int c1 = c0 + bs < seq ? c0 + bs : seq, e = band_end(c1, seq, w);
    blas::matmul_batched(exec, Precision::bf16, blas::Op::T, blas::Op::N, c1 - c0, hd, e - c0, scale,
                         ds + c0 * seq + c0, seq, qkv16 + l.part(0) + c0 * hd, hd, dq + C + c0 * ldq, ldq,
                         l.batch(l.scores(), l.heads(), l.rows_q()));
  }
}

template void attention_forward<float>(const ExecSpace&, Precision, const MatrixU<const float>&,
                                       const MatrixU<float>&, const AttentionScores<float>&, int);
template void attention_forward<double>(const ExecSpace&, Precision, const MatrixU<const double>&,
                                        const MatrixU<double>&, const AttentionScores<double>&, int);
template void attention_backward<float>(const ExecSpace&, Precision, const MatrixU<const float>&,
                                        const AttentionScores<float>&, const MatrixU<const float>&,
                                        const MatrixU<float>&, const AttentionScores<float>&, int);
template void attention_backward<double>(const ExecSpace&, Precision, const MatrixU<const double>&,
                                         const AttentionScores<double>&, const MatrixU<const double>&,
                                         const MatrixU<double>&, const AttentionScores<double>&, int);

}  // namespace tessera::nn
