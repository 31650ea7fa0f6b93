#include "nn/attention.hpp"

#include <cstdint>
#include <stdexcept>
#include <type_traits>

#include "blas/gemm.hpp"
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

/// Where the products find head h of sample b's q (part 0), k (1) or v (2): the fused (B*T, 3C)
/// matrix, rows of 3C ...
template <class T>
struct FusedQkv {
  const T* base;
  Dims d;
  const T* part(Index b, int p, Index h) const { return base + b * d.seq * 3 * d.channels + p * d.channels + h * d.hd; }
  int ld() const { return int(3 * d.channels); }
};
/// ... or bf16_qkv()'s head blocks, rows of hd.
struct HeadBlocksBf16 {
  const std::uint16_t* base;
  Dims d;
  const std::uint16_t* part(Index b, int p, Index h) const {
    return base + ((b * 3 + p) * d.heads + h) * d.seq * d.hd;
  }
  int ld() const { return int(d.hd); }
};

blas::Operand operand(const float* x, int ld) { return {x, nullptr, ld}; }
blas::Operand operand(const std::uint16_t* x, int ld) { return {nullptr, x, ld}; }

/// C = alpha op(A) op(B) + beta C: the float GEMM, or with a bf16 operand the one for those.
template <class T, class A, class B>
void product(const ExecSpace& exec, blas::Op ta, blas::Op tb, int m, int n, int k, T alpha, const A* a, int lda,
             const B* b, int ldb, T beta, T* c, int ldc) {
  if constexpr (std::is_same_v<A, T> && std::is_same_v<B, T>)
    blas::gemm(exec, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  else
    blas::gemm(exec, ta, tb, m, n, k, alpha, operand(a, lda), operand(b, ldb), beta, c, ldc);
}

// Causal products in blocks of `bs` rows (queries) or columns (keys), each only as long as the
// mask lets it be: Q K^T, P V and their query-side gradients take rows [r0, r1) against keys
// [0, r1); dV and dK take keys [c0, c1) against queries [c0, T). With 4 blocks that is 5/8 of the
// full products' FLOPs; short sequences stay one block (one GEMM each). Measured on the default
// GPT (T = 128, 2 ranks, AVX-512): blocks of 16 / 32 / 64 / one of 128 gave 17.0k / 17.2k /
// 16.9k / 16.2k tokens/s.
int causal_block(int seq) { return seq >= 64 ? 32 : seq; }

}  // namespace

namespace {

/// attention_forward on q, k and v from src (FusedQkv or HeadBlocksBf16).
template <class T, class Src>
void forward_from(const ExecSpace& exec, const Src& src, const MatrixU<T>& y, const AttentionScores<T>& att) {
  const Dims d = src.d;
  const int lq = src.ld(), seq = int(d.seq), hd = int(d.hd), bs = causal_block(seq);
  const T scale = T(1) / math::sqrt(T(d.hd));
  for (Index b = 0; b < d.batch; ++b)
    for (Index h = 0; h < d.heads; ++h) {
      const auto* q = src.part(b, 0, h);
      const auto* k = src.part(b, 1, h);
      T* s = att.data() + (b * d.heads + h) * d.seq * d.seq;
      for (int r0 = 0; r0 < seq; r0 += bs) {  // S = scale Q K^T, rows [r0, r1) against keys [0, r1)
        const int r1 = r0 + bs < seq ? r0 + bs : seq;
        product(exec, blas::Op::N, blas::Op::T, r1 - r0, r1, hd, scale, q + r0 * lq, lq, k, lq, T(0), s + r0 * seq,
                seq);
      }
    }
  // Causal softmax of every row in place; zero above the diagonal.
  const Index rows = d.batch * d.heads * d.seq, n = d.seq;
  T* base = att.data();
  Kokkos::parallel_for(
      "tessera::nn::attention_forward::softmax", Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<Index>>(exec, 0, rows),
      KOKKOS_LAMBDA(const Index r) {
        T* p = base + r * n;
        const Index i = r % n;
        T m = p[0];
        TESSERA_SIMD_REDUCTION(max : m)
        for (Index j = 1; j <= i; ++j) m = p[j] > m ? p[j] : m;
        T sum = T(0);
        TESSERA_SIMD_REDUCTION(+ : sum)
        for (Index j = 0; j <= i; ++j) {
          p[j] = math::vexp(p[j] - m);
          sum += p[j];
        }
        const T inv = T(1) / sum;
        TESSERA_SIMD
        for (Index j = 0; j <= i; ++j) p[j] *= inv;
        for (Index j = i + 1; j < n; ++j) p[j] = T(0);
      });
  const int ldy = int(y.stride_0());
  for (Index b = 0; b < d.batch; ++b)
    for (Index h = 0; h < d.heads; ++h) {
      const auto* v = src.part(b, 2, h);
      const T* p = att.data() + (b * d.heads + h) * d.seq * d.seq;
      T* yb = y.data() + b * d.seq * ldy + h * d.hd;
      for (int r0 = 0; r0 < seq; r0 += bs) {  // Y = P V: rows [r0, r1) of P are zero from column r1 on
        const int r1 = r0 + bs < seq ? r0 + bs : seq;
        product(exec, blas::Op::N, blas::Op::N, r1 - r0, hd, r1, T(1), p + r0 * seq, seq, v, lq, T(0),
                yb + r0 * ldy, ldy);
      }
    }
}

/// attention_backward on q, k and v from src; dqkv is the fused (B*T, 3C) matrix.
template <class T, class Src>
void backward_from(const ExecSpace& exec, const Src& src, const AttentionScores<T>& att, const MatrixU<const T>& dy,
                   const MatrixU<T>& dqkv, const AttentionScores<T>& dscores) {
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
        const int r1 = r0 + bs < seq ? r0 + bs : seq;
        product(exec, blas::Op::N, blas::Op::T, r1 - r0, r1, hd, T(1), dyb + r0 * ldy, ldy, v, lq, T(0),
                dp + r0 * seq, seq);
      }
      for (int c0 = 0; c0 < seq; c0 += bs) {  // dV = P^T dY: keys [c0, c1) are seen by queries [c0, T)
        const int c1 = c0 + bs < seq ? c0 + bs : seq;
        blas::gemm(exec, blas::Op::T, blas::Op::N, c1 - c0, hd, seq - c0, T(1), p + c0 * seq + c0, seq,
                   dyb + c0 * ldy, ldy, T(0), dv + c0 * ld, ld);
      }
    }
  // dS = P (dP - rowsum(P dP)), in place of dP; zero above the diagonal.
  const Index rows = d.batch * d.heads * d.seq, n = d.seq;
  const T* pb = att.data();
  T* db = dscores.data();
  Kokkos::parallel_for(
      "tessera::nn::attention_backward::softmax", Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<Index>>(exec, 0, rows),
      KOKKOS_LAMBDA(const Index r) {
        const T* p = pb + r * n;
        T* g = db + r * n;
        const Index i = r % n;
        T dot = T(0);
        TESSERA_SIMD_REDUCTION(+ : dot)
        for (Index j = 0; j <= i; ++j) dot += p[j] * g[j];
        TESSERA_SIMD
        for (Index j = 0; j <= i; ++j) g[j] = p[j] * (g[j] - dot);
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
        const int r1 = r0 + bs < seq ? r0 + bs : seq;
        product(exec, blas::Op::N, blas::Op::N, r1 - r0, hd, r1, scale, ds + r0 * seq, seq, k, lq, T(0),
                dq + r0 * ld, ld);
      }
      for (int c0 = 0; c0 < seq; c0 += bs) {  // dK = scale dS^T Q
        const int c1 = c0 + bs < seq ? c0 + bs : seq;
        product(exec, blas::Op::T, blas::Op::N, c1 - c0, hd, seq - c0, scale, ds + c0 * seq + c0, seq, q + c0 * lq,
                lq, T(0), dk + c0 * ld, ld);
      }
    }
}

}  // namespace

template <class T>
void attention_forward(const ExecSpace& exec, const MatrixU<const T>& qkv, const MatrixU<T>& y,
                       const AttentionScores<T>& att) {
  forward_from(exec, FusedQkv<T>{qkv.data(), dims_of(qkv, att)}, y, att);
}

template <class T>
void attention_backward(const ExecSpace& exec, const MatrixU<const T>& qkv,
                        const AttentionScores<T>& att, const MatrixU<const T>& dy,
                        const MatrixU<T>& dqkv, const AttentionScores<T>& dscores) {
  backward_from(exec, FusedQkv<T>{qkv.data(), dims_of(qkv, att)}, att, dy, dqkv, dscores);
}

void qkv_to_bf16(const ExecSpace& exec, const MatrixU<const float>& qkv, int heads, int seq, std::uint16_t* out) {
  const Index rows = Index(qkv.extent(0)), c = Index(qkv.extent(1)) / 3, H = heads, T = seq;
  if (H < 1 || T < 1 || Index(qkv.extent(1)) != 3 * c || c % H != 0 || rows % T != 0)
    throw std::invalid_argument("tessera::nn::qkv_to_bf16: expected qkv (B*T, 3C) with C divisible by heads");
  const Index hd = c / H;
  Kokkos::parallel_for(
      "tessera::nn::qkv_to_bf16", range(exec, rows), KOKKOS_LAMBDA(const Index r) {
        const Index b = r / T, t = r % T;
        for (Index p = 0; p < 3; ++p)
          for (Index h = 0; h < H; ++h) {
            const float* in = &qkv(r, p * c + h * hd);
            std::uint16_t* o = out + ((b * 3 + p) * H + h) * T * hd + t * hd;
            TESSERA_SIMD
            for (Index e = 0; e < hd; ++e) o[e] = kernels::to_bf16_bits(in[e]);
          }
      });
}

void attention_forward_bf16(const ExecSpace& exec, const std::uint16_t* qkv16, const MatrixU<float>& y,
                            const AttentionScores<float>& att) {
  forward_from(exec, HeadBlocksBf16{qkv16, dims_of(Index(y.extent(0)), Index(y.extent(1)), att)}, y, att);
}

void attention_backward_bf16(const ExecSpace& exec, const std::uint16_t* qkv16, const AttentionScores<float>& att,
                             const MatrixU<const float>& dy, const MatrixU<float>& dqkv,
                             const AttentionScores<float>& dscores) {
  backward_from(exec, HeadBlocksBf16{qkv16, dims_of(Index(dqkv.extent(0)), Index(dqkv.extent(1)) / 3, att)}, att,
                dy, dqkv, dscores);
}

template void attention_forward<float>(const ExecSpace&, const MatrixU<const float>&, const MatrixU<float>&,
                                       const AttentionScores<float>&);
template void attention_forward<double>(const ExecSpace&, const MatrixU<const double>&, const MatrixU<double>&,
                                        const AttentionScores<double>&);
template void attention_backward<float>(const ExecSpace&, const MatrixU<const float>&, const AttentionScores<float>&,
                                        const MatrixU<const float>&, const MatrixU<float>&,
                                        const AttentionScores<float>&);
template void attention_backward<double>(const ExecSpace&, const MatrixU<const double>&,
                                         const AttentionScores<double>&, const MatrixU<const double>&,
                                         const MatrixU<double>&, const AttentionScores<double>&);

}  // namespace tessera::nn
