#pragma once
// Causal multi-head self-attention through batched matrix products: the same arithmetic as
// kernels/attention.hpp (which stays the reference), with every head's Q K^T, P V and their
// gradients as GEMMs on strided views of the fused qkv (B*T, 3C) buffer (q at columns [0, C),
// k at [C, 2C), v at [2C, 3C); head h at h*hd of each). The causal softmax and its backward are
// Kokkos kernels, one thread per row. Each T x T product runs as two row blocks, which skips the
// masked quarter above the diagonal of the first block (finer blocks cost more in small GEMMs
// than they save).
#include "kernels/views.hpp"

namespace tessera::nn {

template <class T>
using AttentionScores =
    Kokkos::View<T****, Kokkos::LayoutRight, MemSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;

/// \brief y (B*T, C) from qkv (B*T, 3C); att (B, heads, T, T) gets the probabilities (zero above
/// the diagonal).
template <class T>
void attention_forward(const ExecSpace& exec, const MatrixU<const T>& qkv, const MatrixU<T>& y,
                       const AttentionScores<T>& att);

/// \brief dqkv (B*T, 3C) (overwritten) from dy (B*T, C), with qkv and att of the forward;
/// dscores (B, heads, T, T) is scratch.
template <class T>
void attention_backward(const ExecSpace& exec, const MatrixU<const T>& qkv,
                        const AttentionScores<T>& att, const MatrixU<const T>& dy,
                        const MatrixU<T>& dqkv, const AttentionScores<T>& dscores);

}  // namespace tessera::nn
