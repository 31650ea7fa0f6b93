// The GPT's head (blocks of nn/gpt.cpp end here): the final LayerNorm, the logits through the tied
// token embedding, the cross-entropy loss and its gradient, and the logits generation reads.
#include <fmt/format.h>

#include <cmath>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "blas/gemm.hpp"
#include "core/error.hpp"
#include "kernels/layernorm.hpp"
#include "kernels/math.hpp"
#include "kernels/precision.hpp"
#include "kernels/rmsnorm.hpp"
#include "kernels/simd.hpp"
#include "nn/gpt.hpp"

namespace tessera::nn {

template <class T>
void Gpt<T>::final_norm(const ExecSpace& exec, const MatrixU<const T>& x, const Slot& s, int tokens) const {
  const auto n = std::size_t(tokens);
  const VectorU<T> rstd = first(s.rstdf, n);
  const auto norm = [&](const auto& out) {
    if (shape_.llama) kernels::rmsnorm_forward(exec, x, store_->value(lnf_w_), out, rstd, shape_.norm_eps);
    else kernels::layernorm_forward(exec, x, store_->value(lnf_w_), store_->value(lnf_b_), out, first(s.meanf, n), rstd);
  };
  if (bf16_acts()) {
    if constexpr (std::is_same_v<T, float>) norm(first_rows(s.hf16, n));
  } else {
    norm(first_rows(s.hf, n));
  }
}

template <class T>
void Gpt<T>::head_forward(const ExecSpace& exec, const MatrixU<const T>& x, const Slot& s, int tokens) const {
  if (hooks_) hooks_->before_forward(lnf_unit_);
  final_norm(exec, x, s, tokens);
  const bool h16 = bf16_acts();
  if (hooks_) {
    hooks_->after_forward(lnf_unit_);
    hooks_->before_forward(head_unit());
  }
  const int C = shape_.width;
  const Precision p = part_.precision;
  T* logits = s.logits.data();
  if constexpr (std::is_same_v<T, float>) {
    if (h16 || bf16_weights(*store_, p)) {  // logits = hf W_head^T from bf16 operands (into bf16 with hf)
      const blas::Operand hf = h16 ? blas::Operand{nullptr, s.hf16.data(), C} : blas::Operand{s.hf.data(), nullptr, C};
      if (h16)
        blas::matmul(exec, p, blas::Op::N, blas::Op::T, tokens, vocab_local_, C, 1.0f, hf, head_weight_operand(exec),
                     s.logits16.data(), vocab_local_);
      else
        blas::matmul(exec, p, blas::Op::N, blas::Op::T, tokens, vocab_local_, C, 1.0f, hf, head_weight_operand(exec),
                     0.0f, logits, vocab_local_);
      if (hooks_) hooks_->after_forward(head_unit());
      return;
    }
  }
  const MatrixU<T> w = store_->value_matrix(head_weight());
  blas::matmul(exec, p, blas::Op::N, blas::Op::T, tokens, vocab_local_, C, T(1), s.hf.data(), C, w.data(), C, T(0),
               logits, vocab_local_);
  if (hooks_) hooks_->after_forward(head_unit());
}

template <class T>
blas::Operand Gpt<T>::head_weight_operand(const ExecSpace& exec) const {
  if constexpr (std::is_same_v<T, float>) {
    if (bf16_weights(*store_, part_.precision)) return {nullptr, store_->bf16_value(exec, head_weight()), shape_.width};
    return {store_->value_matrix(head_weight()).data(), nullptr, shape_.width};
  } else {
    (void)exec;
    throw std::logic_error("tessera::nn::Gpt: bf16 operands of a double model");
  }
}

template <class T>
void Gpt<T>::head_backward(const ExecSpace& exec, const Slot& s, int tokens) const {
  // dW_head += dlogits^T hf, dhf = dlogits W_head (a partial sum over the vocabulary).
  const int C = shape_.width, Vl = vocab_local_;
  const Precision p = part_.precision;
  const T* dlogits = s.dlogits.data();
  T* dhf = dhf_.data();
  if (hooks_) hooks_->before_backward(head_unit());
  T* dw = store_->grad_matrix(head_weight()).data();
  bool done = false;
  if constexpr (std::is_same_v<T, float>) {
    const bool h16 = bf16_acts();
    if (h16 || bf16_weights(*store_, p)) {
      const blas::Operand hf = h16 ? blas::Operand{nullptr, s.hf16.data(), C} : blas::Operand{s.hf.data(), nullptr, C};
      const blas::Operand dl =
          h16 ? blas::Operand{nullptr, s.dlogits16.data(), Vl} : blas::Operand{dlogits, nullptr, Vl};
      blas::matmul(exec, p, blas::Op::T, blas::Op::N, Vl, C, tokens, 1.0f, dl, hf, 1.0f, dw, C);
      blas::matmul(exec, p, blas::Op::N, blas::Op::N, tokens, C, Vl, 1.0f, dl, head_weight_operand(exec), 0.0f, dhf,
                   C);
      done = true;
    }
  }
  if (!done) {
    const MatrixU<T> w = store_->value_matrix(head_weight());
    blas::matmul(exec, p, blas::Op::T, blas::Op::N, Vl, C, tokens, T(1), dlogits, Vl, s.hf.data(), C, T(1), dw, C);
    blas::matmul(exec, p, blas::Op::N, blas::Op::N, tokens, C, Vl, T(1), dlogits, Vl, w.data(), C, T(0), dhf, C);
  }
  // On a single stage a tied head shares its unit with the embedding, whose backward ends it.
  if (hooks_ && head_own_unit() != npos) hooks_->after_backward(head_own_unit());
}

namespace {

/// The vocabulary-parallel cross-entropy of Gpt::loss on logits (n, Vl) of element type L and
/// their gradient dlogits of type D (T, or std::uint16_t: bf16 read as floats, written rounded
/// once), fp32 (T) arithmetic; buf is the (max, sum) and target-logit scratch, `sum` sums it over
/// the tensor group. Returns the loss and correct sums over the rows.
template <class T, class L, class D, class Sum>
LossSums cross_entropy(const ExecSpace& exec, const MatrixU<const L>& logits, const MatrixU<D>& dlogits,
                       const VectorU<const std::int32_t>& labels, const VectorU<T>& buf, Index first, Index tp,
                       Index t, T per_token, const Sum& sum) {
  const Index n = Index(logits.extent(0)), Vl = Index(logits.extent(1));
  // buf: [tp][n][2] (max, sum of exp(l - max)) of each rank's vocabulary rows, then [n] the
  // target's logit (from the rank that holds it): summed over the group, zeros elsewhere.
  Kokkos::deep_copy(exec, buf, T(0));
  Kokkos::parallel_for(
      "tessera::nn::Gpt::loss::local", Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<Index>>(exec, 0, n),
      KOKKOS_LAMBDA(const Index i) {
        const L* li = &logits(i, 0);
        T m = kernels::loaded(li[0]);
        TESSERA_SIMD_REDUCTION(max : m)
        for (Index v = 1; v < Vl; ++v) {
          const T x = kernels::loaded(li[v]);
          m = x > m ? x : m;
        }
        T s = T(0);
        TESSERA_SIMD_REDUCTION(+ : s)
        for (Index v = 0; v < Vl; ++v) s += math::vexp(T(kernels::loaded(li[v])) - m);
        buf((t * n + i) * 2) = m;
        buf((t * n + i) * 2 + 1) = s;
        const Index target = Index(labels(i)) - first;
        if (target >= 0 && target < Vl) buf(tp * n * 2 + i) = kernels::loaded(li[target]);
      });
  if (tp > 1) {
    exec.fence();
    sum(buf.data(), buf.size());
  }
  // Every rank now knows each row's global max M, sum S = sum_r s_r exp(m_r - M), target logit.
  Kokkos::parallel_for(
      "tessera::nn::Gpt::loss::grad", Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<Index>>(exec, 0, n),
      KOKKOS_LAMBDA(const Index i) {
        T M = buf(i * 2);
        for (Index r = 1; r < tp; ++r) M = buf((r * n + i) * 2) > M ? buf((r * n + i) * 2) : M;
        T S = T(0);
        for (Index r = 0; r < tp; ++r) S += buf((r * n + i) * 2 + 1) * math::exp(buf((r * n + i) * 2) - M);
        const T c = per_token / S;
        const L* li = &logits(i, 0);
        D* di = &dlogits(i, 0);
        TESSERA_SIMD
        for (Index v = 0; v < Vl; ++v) kernels::stored(di[v]) = c * math::vexp(T(kernels::loaded(li[v])) - M);
        const Index target = Index(labels(i)) - first;
        if (target >= 0 && target < Vl) {
          if constexpr (std::is_same_v<D, T>) di[target] -= per_token;
          else kernels::stored(di[target]) = c * math::vexp(T(kernels::loaded(li[target])) - M) - per_token;
        }
      });
  double loss_sum = 0.0, correct = 0.0;
  Kokkos::parallel_reduce(
      "tessera::nn::Gpt::loss::sum", Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<Index>>(exec, 0, n),
      KOKKOS_LAMBDA(const Index i, double& l, double& c) {
        T M = buf(i * 2);
        for (Index r = 1; r < tp; ++r) M = buf((r * n + i) * 2) > M ? buf((r * n + i) * 2) : M;
        T S = T(0);
        for (Index r = 0; r < tp; ++r) S += buf((r * n + i) * 2 + 1) * math::exp(buf((r * n + i) * 2) - M);
        const T target = buf(tp * n * 2 + i);
        l += double(math::log(S) + M - target);
        c += target >= M ? 1.0 : 0.0;
      },
      loss_sum, correct);
  return {loss_sum, correct};
}

}  // namespace

template <class T>
LossSums Gpt<T>::loss(const ExecSpace& exec, int slot, VectorU<const std::int32_t> labels,
                      MatrixU<const T> /*targets*/, T scale) {
  const int batch = this->batch_of(slot);
  const auto n = static_cast<Index>(batch) * seq_;
  const Slot& s = slots_[std::size_t(slot)];
  const Index Vl = vocab_local_;
  if (Index(labels.extent(0)) != n)
    throw std::invalid_argument(fmt::format("tessera::nn::Gpt::loss: {} labels for {} positions",
                                            labels.extent(0), n));
  const VectorU<T> buf(xent_.data(), std::size_t(n * (2 * part_.tp + 1)));
  const T per_token = scale / T(shape_.context);
  const auto positions = [&](const auto& m) {  // (B, T*Vl) as (B*T, Vl)
    using E = typename std::decay_t<decltype(m)>::value_type;
    return MatrixU<E>(m.data(), std::size_t(n), std::size_t(Vl));
  };
  const LossSums r = [&] {
    if constexpr (std::is_same_v<T, float>) {
      if (bf16_acts())
        return cross_entropy<T>(exec, MatrixU<const std::uint16_t>(positions(s.logits16)), positions(s.dlogits16),
                                labels, buf, vocab_first_, part_.tp, part_.t, per_token, part_.tensor_sum);
    }
    return cross_entropy<T>(exec, MatrixU<const T>(positions(s.logits)), positions(s.dlogits), labels, buf,
                            vocab_first_, part_.tp, part_.t, per_token, part_.tensor_sum);
  }();
  // Per sample: the mean over all T positions, of which this rank holds T/sp (the rest on the
  // other ranks of its context group: summed there).
  double sums[2] = {r.loss / shape_.context, r.correct / shape_.context};
  if (part_.sp > 1) part_.spatial_sum(sums, 2);
  return {sums[0], sums[1]};
}

namespace {

/// out(b, v) = the logits (B*T rows of Vl, fp32 or bf16) of position p of sample b. A function,
/// not a generic lambda: nvcc takes no device lambda inside one.
template <class E, class T>
void last_logits(const ExecSpace& exec, const E* data, int batch, Index seq, Index Vl, Index p, const MatrixU<T>& out) {
  const MatrixU<const E> logits(data, std::size_t(batch) * std::size_t(seq), std::size_t(Vl));
  Kokkos::parallel_for(
      "tessera::nn::Gpt::next_token_logits",
      Kokkos::MDRangePolicy<ExecSpace, Kokkos::Rank<2>, Kokkos::IndexType<Index>>(exec, {0, 0}, {Index(batch), Vl}),
      KOKKOS_LAMBDA(const Index b, const Index v) { out(b, v) = T(kernels::loaded(logits(b * seq + p, v))); });
}

}  // namespace

template <class T>
void Gpt<T>::next_token_logits(const ExecSpace& exec, int slot, int positions, const MatrixU<T>& out) {
  if (!first_stage() || !last_stage())
    throw std::logic_error("tessera::nn::Gpt::next_token_logits needs the whole model on one stage");
  forward(exec, slot);  // causal: positions after `positions` do not change the earlier logits
  const int batch = this->batch_of(slot);
  const Slot& s = slots_[std::size_t(slot)];
  const Index Vl = vocab_local_, T_ = shape_.context, p = positions - 1;
  if (bf16_acts()) last_logits(exec, static_cast<const std::uint16_t*>(s.logits16.data()), batch, T_, Vl, p, out);
  else last_logits(exec, static_cast<const T*>(s.logits.data()), batch, T_, Vl, p, out);
}

#define TESSERA_GPT_HEAD(T)                                                                                        \
  template void Gpt<T>::final_norm(const ExecSpace&, const MatrixU<const T>&, const Slot&, int) const;           \
  template void Gpt<T>::head_forward(const ExecSpace&, const MatrixU<const T>&, const Slot&, int) const;          \
  template blas::Operand Gpt<T>::head_weight_operand(const ExecSpace&) const;                                      \
  template void Gpt<T>::head_backward(const ExecSpace&, const Slot&, int) const;                                   \
  template LossSums Gpt<T>::loss(const ExecSpace&, int, VectorU<const std::int32_t>, MatrixU<const T>, T);         \
  template void Gpt<T>::next_token_logits(const ExecSpace&, int, int, const MatrixU<T>&);
TESSERA_GPT_HEAD(float)
TESSERA_GPT_HEAD(double)
#undef TESSERA_GPT_HEAD

}  // namespace tessera::nn
