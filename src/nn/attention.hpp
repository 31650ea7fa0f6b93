#pragma once
// Causal multi-head self-attention through matrix products: the same arithmetic as
// kernels/attention.hpp (which stays the reference), with every head's Q K^T, P V and their
// gradients as GEMMs on strided views of the fused qkv (B*T, 3C) buffer (q at columns [0, C),
// k at [C, 2C), v at [2C, 3C); head h at h*hd of each). The causal softmax and its backward are
// Kokkos kernels, one thread per row. Each T x T product runs in blocks of rows (or keys) as long
// as the mask lets them be, which skips most of the masked half; under a sliding window (`window`
// W > 0: query i sees keys i - W < j <= i) a block also starts at the first key its rows see, so
// the products cost O(T (W + block)) instead of O(T^2). Under bf16 operands the whole attention
// runs in bf16 buffers, one batched product per block over all samples and heads.
#include <cstdint>

#include "core/precision.hpp"
#include "kernels/views.hpp"

namespace tessera::nn {

/// True where the GPT runs the fused attention below: a build whose memory the host cannot
/// read (a GPU), where one GEMM per head and block of rows would cost a launch each. The host
/// keeps the GEMM attention.
inline constexpr bool fused_attention = !Kokkos::SpaceAccessibility<HostSpace, MemSpace>::accessible;

/// The widest head (model.width / model.heads) the fused attention takes (kernels/flash_attention.hpp).
inline constexpr int fused_attention_max_head_width = 128;

/// The last extent of att and dscores for the attention of this build: T (the probabilities and
/// their gradients), or 1 (the fused attention's per-row statistics).
inline std::size_t attention_scores_width(std::size_t seq) { return fused_attention ? 1 : seq; }

template <class T>
using AttentionScores =
    Kokkos::View<T****, Kokkos::LayoutRight, MemSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;

/// The first `batch` samples of a (B, heads, T, width) scores buffer sized for the largest batch.
template <class E>
AttentionScores<E> batch_scores(const Kokkos::View<E****, Kokkos::LayoutRight, MemSpace>& a, int batch) {
  return AttentionScores<E>(a.data(), std::size_t(batch), a.extent(1), a.extent(2), a.extent(3));
}

/// \brief y (B*T, C) from qkv (B*T, 3C); att (B, heads, T, T) gets the probabilities (zero above
/// the diagonal and left of the window). Every product in precision p (blas::matmul: the model's
/// train.precision).
/// \param window  the positions each query sees, itself included (model.window); 0: every earlier one
template <class T>
void attention_forward(const ExecSpace& exec, Precision p, const MatrixU<const T>& qkv, const MatrixU<T>& y,
                       const AttentionScores<T>& att, int window = 0);

/// \brief dqkv (B*T, 3C) (overwritten) from dy (B*T, C), with qkv and att of the forward;
/// dscores (B, heads, T, T) is scratch. Every product in precision p, and the window, as the
/// forward's.
template <class T>
void attention_backward(const ExecSpace& exec, Precision p, const MatrixU<const T>& qkv,
                        const AttentionScores<T>& att, const MatrixU<const T>& dy,
                        const MatrixU<T>& dqkv, const AttentionScores<T>& dscores, int window = 0);

/// \brief qkv (B*T, 3C, fp32) in bf16 for the products of the attention under bf16 operands
/// (blas::bf16_operands(Precision::bf16)): out (B*T*3C) gets to_bf16_bits of every element, head by head: sample
/// b's q (p = 0), k (1) or v (2) of head h is the T x hd block at ((b*3 + p)*heads + h)*T*hd,
/// rows of hd, laid out as the products' packed copies of the fused matrix's slices were (so
/// the same products, the same bits).
void qkv_to_bf16(const ExecSpace& exec, const MatrixU<const float>& qkv, int heads, int seq, std::uint16_t* out);
/// \brief The same from qkv in bf16 already (the product stored it so): the head blocks are a
/// copy of its elements.
void qkv_to_bf16(const ExecSpace& exec, const MatrixU<const std::uint16_t>& qkv, int heads, int seq,
                 std::uint16_t* out);

/// \brief The attention under bf16 operands (its products in bf16; needs
/// blas::bf16_operands(Precision::bf16)), bf16 from end to end: q, k and v from qkv_to_bf16's head
/// blocks, y16 (B*T, C) and att16 (B, heads, T, T: the probabilities, zero above the diagonal and
/// left of the window) written in bf16. Each causal block's product is one batched call over the
/// samples and heads (blas::matmul_batched); the softmax reads the bf16
/// scores and writes the bf16 probabilities with fp32 arithmetic. window as attention_forward's.
void attention_forward_bf16(const ExecSpace& exec, const std::uint16_t* qkv16, const MatrixU<std::uint16_t>& y16,
                            const AttentionScores<std::uint16_t>& att16, int window = 0);

/// \brief Its backward: dqkv16 (B*T, 3C, bf16, overwritten) from dy16 (B*T, C, bf16) with the
/// forward's qkv16 and att16; ds16 (B, heads, T, T, bf16) is scratch. The softmax's backward reads
/// the bf16 probabilities (fp32 arithmetic), so the gradients differ from attention_backward on
/// the same values in the last bits of bf16, as autocast's do.
void attention_backward_bf16(const ExecSpace& exec, const std::uint16_t* qkv16,
                             const AttentionScores<std::uint16_t>& att16, const MatrixU<const std::uint16_t>& dy16,
                             const MatrixU<std::uint16_t>& dqkv16, const AttentionScores<std::uint16_t>& ds16,
                             int window = 0);

/// \brief The fused attention (kernels/flash_attention.hpp, nn/fused_attention.cpp) behind the
/// interface of attention_forward: y (B*T, C) from qkv (B*T, 3C); att is (B, heads, T, 1) and
/// gets each row's log-sum-exp in place of the probabilities, so no (B, heads, T, T) memory.
/// window as attention_forward's.
template <class T>
void fused_attention_forward(const ExecSpace& exec, const MatrixU<const T>& qkv, const MatrixU<T>& y,
                             const AttentionScores<T>& att, int window = 0);

/// \brief Backward of fused_attention_forward, as attention_backward; dscores (B, heads, T, 1)
/// is scratch.
template <class T>
void fused_attention_backward(const ExecSpace& exec, const MatrixU<const T>& qkv,
                              const AttentionScores<T>& att, const MatrixU<const T>& dy,
                              const MatrixU<T>& dqkv, const AttentionScores<T>& dscores, int window = 0);

}  // namespace tessera::nn
