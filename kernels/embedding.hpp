#pragma once
// Token plus position embedding of a GPT input, and its gradients.
//   x[b*T + t, c] = wte[token[b, t], c] + wpe[t, c]
// tokens (B, T) integer in [0, V), wte (V, C), wpe (maxT, C) with maxT >= T, x (B*T, C).
// Nothing is saved for backward beyond the tokens themselves.
// Backward, accumulated (+=, for micro-batches), deterministic and without atomics:
//   dwpe[t, c] += sum_b dx[b*T + t, c]                     one thread per (t, c)
//   dwte[v, c] += sum_{(b,t): token[b,t] = v} dx[b*T+t, c]  one thread per v, scanning all B*T
//                                                          tokens (fine for a byte vocabulary)
// Tokens are trusted: validate them when the data is read.
// Vocabulary-parallel (Megatron): a rank holding rows [first, first + V) of the logical table
// passes its block as wte and `first`; tokens outside its rows contribute nothing here (the
// caller sums x over the tensor group, one rank adding the positions).
#include <stdexcept>

#include "kernels/positions.hpp"
#include "kernels/views.hpp"

namespace tessera::kernels {

/// \brief x = wte[tokens - first] (0 where that row is not in wte) + wpe[position] (when
/// add_positions; pos(t) under context parallelism, where the tokens are a block or two chunks of
/// the sequence). tokens (B,T), wte (V,C), wpe (maxT,C) with maxT >= pos.end(T), x (B*T,C) (overwritten).
/// Without add_positions wpe is not read (an empty view will do: a model without position
/// embeddings).
template <class TokView, class WteView, class WpeView, class XView>
void embedding_forward(const ExecSpace& exec, const TokView& tokens, const WteView& wte,
                       const WpeView& wpe, const XView& x, Index first = 0,
                       bool add_positions = true, Positions pos = {}) {
  using T = typename XView::non_const_value_type;
  const Index seq = Index(tokens.extent(1));
  if ((add_positions && (Index(wpe.extent(0)) < pos.end(seq) || x.extent(1) != wpe.extent(1))) ||
      Index(x.extent(0)) != Index(tokens.extent(0)) * seq || x.extent(1) != wte.extent(1)) {
    throw std::invalid_argument(
        "tessera::embedding_forward: expected tokens (B,T), wte (V,C), wpe (>=T,C), x (B*T,C)");
  }
  using Policy = Kokkos::MDRangePolicy<ExecSpace, Kokkos::Rank<2>, Kokkos::IndexType<Index>>;
  const Index vocab = Index(wte.extent(0));
  Kokkos::parallel_for(
      "tessera::embedding_forward", Policy(exec, {0, 0}, {Index(x.extent(0)), Index(x.extent(1))}),
      KOKKOS_LAMBDA(const Index row, const Index c) {
        const Index b = row / seq, t = row % seq;
        const Index v = Index(tokens(b, t)) - first;
        const T e = v >= 0 && v < vocab ? T(wte(v, c)) : T(0);
        x(row, c) = add_positions ? e + T(wpe(pos(t), c)) : e;
      });
}

/// \brief dwte (rows [first, first + V) of the logical table) and dwpe accumulate the gradient
/// of embedding_forward. tokens (B,T), dx (B*T,C), dwte (V,C), dwpe (maxT,C) with maxT >= T
/// (rows >= T untouched); an empty dwpe: a model without position embeddings (none summed).
template <class TokView, class DxView, class DwteView, class DwpeView>
void embedding_backward(const ExecSpace& exec, const TokView& tokens, const DxView& dx,
                        const DwteView& dwte, const DwpeView& dwpe, Index first = 0, Positions pos = {}) {
  using T = typename DwteView::non_const_value_type;
  const Index batch = Index(tokens.extent(0)), seq = Index(tokens.extent(1));
  const bool positions = dwpe.extent(0) > 0;
  if ((positions && (Index(dwpe.extent(0)) < pos.end(seq) || dx.extent(1) != dwpe.extent(1))) ||
      Index(dx.extent(0)) != batch * seq || dx.extent(1) != dwte.extent(1)) {
    throw std::invalid_argument(
        "tessera::embedding_backward: expected tokens (B,T), dx (B*T,C), dwte (V,C), dwpe (>=T,C)");
  }
  using Policy = Kokkos::MDRangePolicy<ExecSpace, Kokkos::Rank<2>, Kokkos::IndexType<Index>>;
  const Index cols = Index(dx.extent(1));
  // Positions: sum over the batch.
  if (positions)
  Kokkos::parallel_for(
      "tessera::embedding_backward::dwpe", Policy(exec, {0, 0}, {seq, cols}),
      KOKKOS_LAMBDA(const Index t, const Index c) {
        T sum = T(0);
        for (Index b = 0; b < batch; ++b) sum += dx(b * seq + t, c);
        dwpe(pos(t), c) += sum;
      });
  // Tokens: each vocabulary row scans every position for its token and adds the matching rows
  // of dx (in position order: deterministic).
  const Index vocab = Index(dwte.extent(0));
  Kokkos::parallel_for(
      "tessera::embedding_backward::dwte", Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<Index>>(exec, 0, vocab),
      KOKKOS_LAMBDA(const Index v) {
        for (Index b = 0; b < batch; ++b)
          for (Index t = 0; t < seq; ++t)
            if (Index(tokens(b, t)) == v + first)
              for (Index c = 0; c < cols; ++c) dwte(v, c) += dx(b * seq + t, c);
      });
}

}  // namespace tessera::kernels
