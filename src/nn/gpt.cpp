#include "nn/gpt.hpp"

#include <fmt/format.h>

#include <cmath>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "blas/gemm.hpp"
#include "core/error.hpp"
#include "core/memory.hpp"
#include "kernels/activation.hpp"
#include "kernels/bias.hpp"
#include "nn/attention.hpp"
#include "kernels/embedding.hpp"
#include "kernels/layernorm.hpp"
#include "kernels/math.hpp"
#include "kernels/simd.hpp"

namespace tessera::nn {

namespace {

template <class T>
using Att = Kokkos::View<T****, Kokkos::LayoutRight, MemSpace>;
template <class T>
using AttU = Kokkos::View<T****, Kokkos::LayoutRight, MemSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;

template <class T>
Matrix<T> alloc_matrix(const std::string& what, std::size_t r, std::size_t c) {
  return Matrix<T>(Kokkos::view_alloc(mem::label(mem::Category::act, "tessera::nn::Gpt::" + what),
                                      Kokkos::WithoutInitializing), r, c);
}

template <class T>
Vector<T> alloc_vector(const std::string& what, std::size_t n) {
  return Vector<T>(Kokkos::view_alloc(mem::label(mem::Category::act, "tessera::nn::Gpt::" + what),
                                      Kokkos::WithoutInitializing), n);
}

template <class T>
VectorU<T> head(const Vector<T>& v, int n) { return VectorU<T>(v.data(), static_cast<std::size_t>(n)); }

/// The first `tokens` rows of m.
template <class E>
MatrixU<E> first_rows(const Matrix<E>& m, int tokens) {
  return MatrixU<E>(m.data(), static_cast<std::size_t>(tokens), m.extent(1));
}

/// Of a tensor that products read, the buffer of element type A: the fp32 one or the bf16 one.
template <class A, class T>
const Matrix<A>& pick(const Matrix<T>& f32, const Matrix<std::uint16_t>& bf16) {
  if constexpr (std::is_same_v<A, std::uint16_t>) return bf16;
  else return f32;
}

/// Linear::forward or forward_bf16, by the element type of x.
template <class T, class A>
void linear_forward(const ExecSpace& exec, const Linear<T>& l, const MatrixU<A>& x, const MatrixU<T>& y,
                    const typename Linear<T>::TensorSum& sum,
                    typename Linear<T>::Bias who = Linear<T>::Bias::layer) {
  if constexpr (std::is_same_v<A, std::uint16_t>) l.forward_bf16(exec, Bf16Matrix(x), y, sum, who);
  else l.forward(exec, MatrixU<const T>(x), y, sum, who);
}

/// Linear::backward or backward_bf16, by the element type of x.
template <class T, class A>
void linear_backward(const ExecSpace& exec, const Linear<T>& l, const MatrixU<A>& x,
                     const std::type_identity_t<MatrixU<const T>>& dy, const MatrixU<T>& dx,
                     const typename Linear<T>::TensorSum& sum,
                     typename Linear<T>::Bias who = Linear<T>::Bias::layer) {
  if constexpr (std::is_same_v<A, std::uint16_t>) l.backward_bf16(exec, Bf16Matrix(x), dy, dx, sum, who);
  else l.backward(exec, MatrixU<const T>(x), dy, dx, sum, who);
}

}  // namespace

template <class T>
Gpt<T>::Gpt(ParamStore<T>& store, const GptShape& shape, Part part)
    : shape_(shape), part_(std::move(part)), store_(&store) {
  const int L = shape_.layers, C = shape_.width, tp = part_.tp, t = part_.t;
  first_ = part_.first_block;
  end_ = part_.end_block < 0 ? L : part_.end_block;
  if (first_ < 0 || first_ >= end_ || end_ > L)
    throw std::invalid_argument(fmt::format("tessera::nn::Gpt: blocks [{}, {}) of {}", first_, end_, L));
  if (shape_.heads < 1 || C % shape_.heads != 0)
    throw std::invalid_argument(fmt::format("tessera::nn::Gpt: width {} is not a multiple of heads {}", C, shape_.heads));
  if (shape_.heads % tp != 0 || shape_.vocab % tp != 0)
    throw std::invalid_argument(fmt::format("tessera::nn::Gpt: {} tensor ranks do not divide the {} heads "
                                            "and the vocabulary of {}", tp, shape_.heads, shape_.vocab));
  if (tp > 1 && !part_.tensor_sum)
    throw std::invalid_argument("tessera::nn::Gpt: tensor parallelism needs a tensor_sum");
  if (fused_attention && C / shape_.heads > fused_attention_max_head_width)
    throw InputError(fmt::format("model.width: {} / model.heads = {} wide heads; the fused attention of a "
                                 "GPU build takes heads up to {} wide: set more model.heads",
                                 C, C / shape_.heads, fused_attention_max_head_width));
  heads_local_ = shape_.heads / tp;
  vocab_local_ = shape_.vocab / tp;
  vocab_first_ = t * vocab_local_;
  const std::int64_t V = shape_.vocab, Vl = vocab_local_;
  const double std_init = 0.02, std_proj = 0.02 / std::sqrt(2.0 * L);  // GPT-2's scaled residual init
  const Placement vocab_rows{{V, C}, {std::int64_t(t) * Vl, 0}, tp > 1, Tie::none};
  const bool tied_across_stages = first_stage() != last_stage();

  if (first_stage()) {
    store.begin_unit(/*solo=*/true);
    wte_unit_ = store.units() - 1;
    Placement p = vocab_rows;
    p.tie = tied_across_stages ? Tie::original : Tie::none;
    wte_ = store.add("wte.weight", {Vl, C}, InitKind::normal, std_init, p);
    store.begin_unit();
    wpe_unit_ = store.units() - 1;
    wpe_ = store.add("wpe.weight", {shape_.context, C}, InitKind::normal, std_init);
  }
  typename Linear<T>::Options column{1, false, InitKind::normal, std_init, true};
  typename Linear<T>::Options qkv_opts = column;
  qkv_opts.groups = 3;
  typename Linear<T>::Options row{1, false, InitKind::normal, std_proj, true};
  for (int i = first_; i < end_; ++i) {
    const std::string n = fmt::format("blocks.{}", i);
    store.begin_unit();
    const std::size_t unit = store.units() - 1;
    const std::size_t ln1_w = store.add(n + ".ln_1.weight", {C}, InitKind::ones);
    const std::size_t ln1_b = store.add(n + ".ln_1.bias", {C}, InitKind::zeros);
    Linear<T> qkv(store, n + ".attn.qkv", C, 3 * C, Split::column, tp, t, qkv_opts);
    Linear<T> proj(store, n + ".attn.proj", C, C, Split::row, tp, t, row);
    const std::size_t ln2_w = store.add(n + ".ln_2.weight", {C}, InitKind::ones);
    const std::size_t ln2_b = store.add(n + ".ln_2.bias", {C}, InitKind::zeros);
    Linear<T> fc(store, n + ".mlp.fc", C, 4 * C, Split::column, tp, t, column);
    Linear<T> mproj(store, n + ".mlp.proj", 4 * C, C, Split::row, tp, t, row);
    blocks_.push_back(Block{unit, ln1_w, ln1_b, ln2_w, ln2_b, qkv, proj, fc, mproj});
  }
  if (last_stage()) {
    store.begin_unit();
    lnf_unit_ = store.units() - 1;
    lnf_w_ = store.add("ln_f.weight", {C}, InitKind::ones);
    lnf_b_ = store.add("ln_f.bias", {C}, InitKind::zeros);
    if (tied_across_stages) {
      store.begin_unit(/*solo=*/true);
      wte_copy_unit_ = store.units() - 1;
      Placement p = vocab_rows;
      p.tie = Tie::copy;
      wte_copy_ = store.add("wte.weight", {Vl, C}, InitKind::normal, std_init, p);
    }
  }
}

template <class T>
int Gpt<T>::input_width() const {
  return first_stage() ? shape_.context : shape_.context * shape_.width;
}

template <class T>
int Gpt<T>::output_width() const {
  return shape_.context * (last_stage() ? vocab_local_ : shape_.width);
}

template <class T>
typename Gpt<T>::Acts Gpt<T>::make_acts(const char* what) const {
  const auto n = static_cast<std::size_t>(this->max_batch()) * static_cast<std::size_t>(shape_.context);
  const auto C = static_cast<std::size_t>(shape_.width);
  const auto Cl = C / static_cast<std::size_t>(part_.tp);
  const std::string w(what);
  Acts a;
  if (bf16_acts_) {  // what only products read, in bf16
    a.ln1_16 = alloc_matrix<std::uint16_t>(w + ".ln1 (bf16)", n, C);
    a.ln2_16 = alloc_matrix<std::uint16_t>(w + ".ln2 (bf16)", n, C);
    a.h16 = alloc_matrix<std::uint16_t>(w + ".h (bf16)", n, 4 * Cl);
    a.qkv16 = alloc_matrix<std::uint16_t>(w + ".qkv (bf16 head blocks)", n, 3 * Cl);
  } else {
    a.ln1 = alloc_matrix<T>(w + ".ln1", n, C);
    a.ln2 = alloc_matrix<T>(w + ".ln2", n, C);
    a.h = alloc_matrix<T>(w + ".h", n, 4 * Cl);
    a.qkv = alloc_matrix<T>(w + ".qkv", n, 3 * Cl);
  }
  a.y = alloc_matrix<T>(w + ".y", n, Cl);
  a.x1 = alloc_matrix<T>(w + ".x1", n, C);
  a.fc = alloc_matrix<T>(w + ".fc", n, 4 * Cl);
  a.mean1 = alloc_vector<T>(w + ".mean1", n);
  a.rstd1 = alloc_vector<T>(w + ".rstd1", n);
  a.mean2 = alloc_vector<T>(w + ".mean2", n);
  a.rstd2 = alloc_vector<T>(w + ".rstd2", n);
  a.att = Att<T>(Kokkos::view_alloc(mem::label(mem::Category::act, "tessera::nn::Gpt::" + w + ".att"),
                                    Kokkos::WithoutInitializing),
                 static_cast<std::size_t>(this->max_batch()), static_cast<std::size_t>(heads_local_),
                 static_cast<std::size_t>(shape_.context),
                 attention_scores_width(static_cast<std::size_t>(shape_.context)));
  return a;
}

template <class T>
void Gpt<T>::add_slot() {
  const auto B = static_cast<std::size_t>(this->max_batch());
  const auto Tn = static_cast<std::size_t>(shape_.context), C = static_cast<std::size_t>(shape_.width);
  const std::size_t n = B * Tn;
  const std::size_t nb = blocks_.size();
  if (slots_.empty()) bf16_acts_ = std::is_same_v<T, float> && blas::bf16_operands();
  Slot& s = slots_.emplace_back();
  s.input = alloc_matrix<T>("input", B, static_cast<std::size_t>(input_width()));
  s.x.push_back(first_stage() ? alloc_matrix<T>("x0", n, C) : Matrix<T>(s.input.data(), n, C));
  for (std::size_t k = 0; k < nb; ++k) {
    s.x.push_back(alloc_matrix<T>(fmt::format("blocks.{}.out", first_ + int(k)), n, C));
    if (!part_.recompute) s.acts.push_back(make_acts(fmt::format("blocks.{}", first_ + int(k)).c_str()));
  }
  if (last_stage()) {
    if (bf16_acts_) s.hf16 = alloc_matrix<std::uint16_t>("ln_f (bf16)", n, C);
    else s.hf = alloc_matrix<T>("ln_f", n, C);
    s.meanf = alloc_vector<T>("ln_f.mean", n);
    s.rstdf = alloc_vector<T>("ln_f.rstd", n);
    s.logits = alloc_matrix<T>("logits", B, Tn * static_cast<std::size_t>(vocab_local_));
    s.dlogits = alloc_matrix<T>("dlogits", B, Tn * static_cast<std::size_t>(vocab_local_));
  } else {
    s.doutput = alloc_matrix<T>("doutput", B, Tn * C);
  }
  if (!first_stage()) s.dinput = alloc_matrix<T>("dinput", B, Tn * C);
  if (slots_.size() == 1) {  // the shared working set, once
    const auto Cl = C / static_cast<std::size_t>(part_.tp);
    if (part_.recompute) work_ = make_acts("recompute");
    dres_ = alloc_matrix<T>("dres", n, C);
    dln_ = alloc_matrix<T>("dln", n, C);
    d1_ = alloc_matrix<T>("d1", n, C);
    dqkv_ = alloc_matrix<T>("dqkv", n, 3 * Cl);
    dy_ = alloc_matrix<T>("dy", n, Cl);
    dh_ = alloc_matrix<T>("dh", n, 4 * Cl);
    if (bf16_acts_) dh16_ = alloc_matrix<std::uint16_t>("dh (bf16)", n, 4 * Cl);
    dhf_ = alloc_matrix<T>("dhf", n, C);
    dscores_ = Att<T>(Kokkos::view_alloc(mem::label(mem::Category::act, "tessera::nn::Gpt::dscores"),
                                         Kokkos::WithoutInitializing),
                      B, static_cast<std::size_t>(heads_local_), Tn, attention_scores_width(Tn));
    xent_ = alloc_vector<T>("xent", n * static_cast<std::size_t>(2 * part_.tp + 1));
  }
}

template <class T>
void Gpt<T>::clear_slots() {
  slots_.clear();
  work_ = Acts{};
  dh16_ = Matrix<std::uint16_t>();
}

template <class T>
MatrixU<T> Gpt<T>::tokens_rows(const Matrix<T>& m, int tokens) const {
  return first_rows(m, tokens);
}

template <class T>
bool Gpt<T>::bf16_acts() const {
  if (bf16_acts_ && !blas::bf16_operands())
    throw std::logic_error("tessera::nn::Gpt: the slots hold bf16 activations, but the products no longer "
                           "take bf16 operands (the matmul precision changed after they were made)");
  return bf16_acts_;
}

template <class T>
MatrixU<T> Gpt<T>::input(int slot) const {
  return rows(slots_[std::size_t(slot)].input, this->batch_of(slot));
}

template <class T>
MatrixU<T> Gpt<T>::output(int slot) const {
  const int batch = this->batch_of(slot);
  const Slot& s = slots_[std::size_t(slot)];
  if (last_stage()) return rows(s.logits, batch);
  return MatrixU<T>(s.x.back().data(), static_cast<std::size_t>(batch),
                    static_cast<std::size_t>(output_width()));
}

template <class T>
MatrixU<T> Gpt<T>::grad_output(int slot) const {
  const int batch = this->batch_of(slot);
  const Slot& s = slots_[std::size_t(slot)];
  return rows(last_stage() ? s.dlogits : s.doutput, batch);
}

template <class T>
MatrixU<T> Gpt<T>::grad_input(int slot) const {
  if (first_stage()) throw std::logic_error("tessera::nn::Gpt::grad_input on the first stage");
  return rows(slots_[std::size_t(slot)].dinput, this->batch_of(slot));
}

template <class T>
void Gpt<T>::tensor_sum(const ExecSpace& exec, const MatrixU<T>& m) const {
  if (part_.tp <= 1) return;
  exec.fence();
  part_.tensor_sum(m.data(), m.size());
}

template <class T>
void Gpt<T>::embed(const ExecSpace& exec, const MatrixU<const T>& tokens, const MatrixU<T>& x) const {
  if (hooks_) {
    hooks_->before_forward(wte_unit_);
    hooks_->before_forward(wpe_unit_);
  }
  kernels::embedding_forward(exec, tokens, store_->value_matrix(wte_), store_->value_matrix(wpe_), x,
                             vocab_first_, part_.t == 0);
  tensor_sum(exec, x);  // one rank added the positions, each its vocabulary rows
  if (hooks_) {
    hooks_->after_forward(wpe_unit_);
    hooks_->after_forward(wte_unit_);
  }
}

template <class T>
void Gpt<T>::block_forward(const ExecSpace& exec, const Block& b, const MatrixU<const T>& x,
                           const Acts& a, int tokens, const MatrixU<T>& out) const {
  if constexpr (std::is_same_v<T, float>) {
    if (bf16_acts()) return block_forward_as<std::uint16_t>(exec, b, x, a, tokens, out);
  }
  block_forward_as<T>(exec, b, x, a, tokens, out);
}

template <class T>
void Gpt<T>::block_backward(const ExecSpace& exec, const Block& b, const MatrixU<const T>& x,
                            const Acts& a, int tokens, const MatrixU<T>& dres) const {
  if constexpr (std::is_same_v<T, float>) {
    if (bf16_acts()) return block_backward_as<std::uint16_t>(exec, b, x, a, tokens, dres);
  }
  block_backward_as<T>(exec, b, x, a, tokens, dres);
}

template <class T>
template <class A>
void Gpt<T>::block_forward_as(const ExecSpace& exec, const Block& b, const MatrixU<const T>& x,
                              const Acts& a, int tokens, const MatrixU<T>& out) const {
  const int batch = tokens / shape_.context;
  const auto r = [&](const auto& m) { return first_rows(m, tokens); };
  const MatrixU<T> qkv = r(a.qkv), y = r(a.y), x1 = r(a.x1), fc = r(a.fc);  // qkv: empty in bf16
  const MatrixU<A> ln1 = r(pick<A>(a.ln1, a.ln1_16)), ln2 = r(pick<A>(a.ln2, a.ln2_16)),
                   h = r(pick<A>(a.h, a.h16));
  kernels::layernorm_forward(exec, x, store_->value(b.ln1_w), store_->value(b.ln1_b), ln1,
                             head(a.mean1, tokens), head(a.rstd1, tokens));
  const AttU<T> att(a.att.data(), std::size_t(batch), a.att.extent(1), a.att.extent(2), a.att.extent(3));
  if constexpr (std::is_same_v<A, std::uint16_t>) {
    // qkv lands in fp32 scratch (backward's dqkv, free until then) and is kept as bf16 head blocks.
    const MatrixU<T> qkv32 = r(dqkv_);
    linear_forward(exec, b.qkv, ln1, qkv32, part_.tensor_sum);
    qkv_to_bf16(exec, qkv32, heads_local_, shape_.context, a.qkv16.data());
    attention_forward_bf16(exec, a.qkv16.data(), y, att);
  } else {
    linear_forward(exec, b.qkv, ln1, qkv, part_.tensor_sum);
    if constexpr (fused_attention) fused_attention_forward<T>(exec, qkv, y, att);
    else attention_forward<T>(exec, qkv, y, att);
  }
  // The biases of proj, fc and mproj come in the kernels after their products (one pass
  // fewer over each output).
  b.proj.forward(exec, y, x1, part_.tensor_sum, Linear<T>::Bias::caller);
  kernels::bias_residual_add(exec, store_->value(b.proj.bias_index()), x, x1);
  kernels::layernorm_forward(exec, MatrixU<const T>(x1), store_->value(b.ln2_w), store_->value(b.ln2_b),
                             ln2, head(a.mean2, tokens), head(a.rstd2, tokens));
  linear_forward(exec, b.fc, ln2, fc, part_.tensor_sum, Linear<T>::Bias::caller);
  kernels::gelu_forward_saving_derivative(exec, store_->value(b.fc.bias_index()), fc, h,
                                          fc);  // fc: gelu' from here on
  linear_forward(exec, b.mproj, h, out, part_.tensor_sum, Linear<T>::Bias::caller);
  kernels::bias_residual_add(exec, store_->value(b.mproj.bias_index()), x1, out);
}

template <class T>
template <class A>
void Gpt<T>::block_backward_as(const ExecSpace& exec, const Block& b, const MatrixU<const T>& x,
                               const Acts& a, int tokens, const MatrixU<T>& dres) const {
  // dres: the gradient of the block's output in, of its input out.
  const int batch = tokens / shape_.context;
  const auto r = [&](const auto& m) { return first_rows(m, tokens); };
  const MatrixU<T> dh = r(dh_), dln = r(dln_), d1 = r(d1_), dy = r(dy_), dqkv = r(dqkv_);
  // MLP sub-block (mproj is row-parallel: its input gradient needs no sum).
  linear_backward(exec, b.mproj, r(pick<A>(a.h, a.h16)), dres, dh, part_.tensor_sum);
  if constexpr (std::is_same_v<A, std::uint16_t>) {  // fc's output gradient only feeds products: bf16
    const MatrixU<std::uint16_t> dh16 = r(dh16_);
    kernels::gelu_backward_saved(exec, r(a.fc), dh, dh16, store_->grad(b.fc.bias_index()));  // and fc's bias
    b.fc.backward_bf16(exec, Bf16Matrix(r(a.ln2_16)), Bf16Matrix(dh16), dln, part_.tensor_sum);
  } else {
    kernels::gelu_backward_saved(exec, r(a.fc), dh, dh, store_->grad(b.fc.bias_index()));  // and fc's bias
    linear_backward(exec, b.fc, r(a.ln2), dh, dln, part_.tensor_sum, Linear<T>::Bias::caller);
  }
  kernels::layernorm_backward(exec, r(a.x1), store_->value(b.ln2_w), head(a.mean2, tokens),
                              head(a.rstd2, tokens), dln, d1, store_->grad(b.ln2_w), store_->grad(b.ln2_b),
                              dres);  // d1: the gradient of x1, through LayerNorm and the residual
  // Attention sub-block.
  b.proj.backward(exec, r(a.y), d1, dy);
  const AttU<T> att(a.att.data(), std::size_t(batch), a.att.extent(1), a.att.extent(2), a.att.extent(3));
  const AttU<T> ds(dscores_.data(), std::size_t(batch), dscores_.extent(1), dscores_.extent(2),
                   dscores_.extent(3));
  if constexpr (std::is_same_v<A, std::uint16_t>) attention_backward_bf16(exec, a.qkv16.data(), att, dy, dqkv, ds);
  else if constexpr (fused_attention) fused_attention_backward<T>(exec, r(a.qkv), att, dy, dqkv, ds);
  else attention_backward<T>(exec, r(a.qkv), att, dy, dqkv, ds);
  linear_backward(exec, b.qkv, r(pick<A>(a.ln1, a.ln1_16)), dqkv, dln, part_.tensor_sum);
  kernels::layernorm_backward(exec, x, store_->value(b.ln1_w), head(a.mean1, tokens),
                              head(a.rstd1, tokens), dln, dres, store_->grad(b.ln1_w), store_->grad(b.ln1_b),
                              d1);
}

template <class T>
void Gpt<T>::head_forward(const ExecSpace& exec, const MatrixU<const T>& x, const Slot& s, int tokens) const {
  if (hooks_) hooks_->before_forward(lnf_unit_);
  const VectorU<T> mean = head(s.meanf, tokens), rstd = head(s.rstdf, tokens);
  const bool h16 = bf16_acts();
  if (h16) {
    if constexpr (std::is_same_v<T, float>)
      kernels::layernorm_forward(exec, x, store_->value(lnf_w_), store_->value(lnf_b_), first_rows(s.hf16, tokens),
                                 mean, rstd);
  } else {
    kernels::layernorm_forward(exec, x, store_->value(lnf_w_), store_->value(lnf_b_), first_rows(s.hf, tokens),
                               mean, rstd);
  }
  if (hooks_) {
    hooks_->after_forward(lnf_unit_);
    hooks_->before_forward(head_unit());
  }
  const int C = shape_.width;
  T* logits = s.logits.data();
  if constexpr (std::is_same_v<T, float>) {
    if (h16 || bf16_weights(*store_)) {  // logits = hf W_head^T from bf16 operands
      const blas::Operand hf = h16 ? blas::Operand{nullptr, s.hf16.data(), C} : blas::Operand{s.hf.data(), nullptr, C};
      blas::gemm(exec, blas::Op::N, blas::Op::T, tokens, vocab_local_, C, 1.0f, hf, head_weight_operand(exec), 0.0f,
                 logits, vocab_local_);
      if (hooks_) hooks_->after_forward(head_unit());
      return;
    }
  }
  const MatrixU<T> w = store_->value_matrix(head_weight());
  blas::gemm(exec, blas::Op::N, blas::Op::T, tokens, vocab_local_, C, T(1), s.hf.data(), C, w.data(), C, T(0),
             logits, vocab_local_);
  if (hooks_) hooks_->after_forward(head_unit());
}

template <class T>
blas::Operand Gpt<T>::head_weight_operand(const ExecSpace& exec) const {
  if constexpr (std::is_same_v<T, float>) {
    if (bf16_weights(*store_)) return {nullptr, store_->bf16_value(exec, head_weight()), shape_.width};
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
  const T* dlogits = s.dlogits.data();
  T* dhf = dhf_.data();
  if (hooks_) hooks_->before_backward(head_unit());
  T* dw = store_->grad_matrix(head_weight()).data();
  bool done = false;
  if constexpr (std::is_same_v<T, float>) {
    const bool h16 = bf16_acts();
    if (h16 || bf16_weights(*store_)) {
      const blas::Operand hf = h16 ? blas::Operand{nullptr, s.hf16.data(), C} : blas::Operand{s.hf.data(), nullptr, C};
      const blas::Operand dl{dlogits, nullptr, Vl};
      blas::gemm(exec, blas::Op::T, blas::Op::N, Vl, C, tokens, 1.0f, dl, hf, 1.0f, dw, C);
      blas::gemm(exec, blas::Op::N, blas::Op::N, tokens, C, Vl, 1.0f, dl, head_weight_operand(exec), 0.0f, dhf, C);
      done = true;
    }
  }
  if (!done) {
    const MatrixU<T> w = store_->value_matrix(head_weight());
    blas::gemm(exec, blas::Op::T, blas::Op::N, Vl, C, tokens, T(1), dlogits, Vl, s.hf.data(), C, T(1), dw, C);
    blas::gemm(exec, blas::Op::N, blas::Op::N, tokens, C, Vl, T(1), dlogits, Vl, w.data(), C, T(0), dhf, C);
  }
  // On a single stage the head shares its unit with the embedding, whose backward ends it.
  if (hooks_ && wte_copy_unit_ != npos) hooks_->after_backward(wte_copy_unit_);
}

template <class T>
void Gpt<T>::forward(const ExecSpace& exec, int slot) {
  ScopedRegion region("tessera::nn::Gpt::forward");
  const int batch = this->batch_of(slot);
  const int tokens = batch * shape_.context;
  Slot& s = slots_[std::size_t(slot)];
  if (first_stage()) embed(exec, rows(s.input, batch), tokens_rows(s.x[0], tokens));
  for (std::size_t k = 0; k < blocks_.size(); ++k) {
    const Block& b = blocks_[k];
    if (hooks_) hooks_->before_forward(b.unit);
    block_forward(exec, b, tokens_rows(s.x[k], tokens), part_.recompute ? work_ : s.acts[k], tokens,
                  tokens_rows(s.x[k + 1], tokens));
    if (hooks_) hooks_->after_forward(b.unit);
  }
  if (last_stage()) head_forward(exec, tokens_rows(s.x.back(), tokens), s, tokens);
}

template <class T>
void Gpt<T>::backward(const ExecSpace& exec, int slot) {
  ScopedRegion region("tessera::nn::Gpt::backward");
  const int batch = this->batch_of(slot);
  const int tokens = batch * shape_.context;
  const std::size_t n = std::size_t(tokens), C = std::size_t(shape_.width);
  Slot& s = slots_[std::size_t(slot)];
  const MatrixU<T> dres = tokens_rows(dres_, tokens);
  if (last_stage()) {
    head_backward(exec, s, tokens);
    const MatrixU<T> dhf = tokens_rows(dhf_, tokens);
    tensor_sum(exec, dhf);
    if (hooks_) hooks_->before_backward(lnf_unit_);
    kernels::layernorm_backward(exec, tokens_rows(s.x.back(), tokens), store_->value(lnf_w_),
                                head(s.meanf, tokens), head(s.rstdf, tokens), dhf, dres,
                                store_->grad(lnf_w_), store_->grad(lnf_b_));
    if (hooks_) hooks_->after_backward(lnf_unit_);
  } else {
    Kokkos::deep_copy(exec, dres, MatrixU<T>(s.doutput.data(), n, C));
  }
  for (std::size_t k = blocks_.size(); k-- > 0;) {
    const Block& b = blocks_[k];
    if (hooks_) hooks_->before_backward(b.unit);
    const MatrixU<const T> x = tokens_rows(s.x[k], tokens);
    if (part_.recompute) {
      block_forward(exec, b, x, work_, tokens, tokens_rows(d1_, tokens));  // output unused
      block_backward(exec, b, x, work_, tokens, dres);
    } else {
      block_backward(exec, b, x, s.acts[k], tokens, dres);
    }
    if (hooks_) hooks_->after_backward(b.unit);
  }
  if (first_stage()) {
    if (hooks_) {
      hooks_->before_backward(wpe_unit_);
      hooks_->before_backward(wte_unit_);
    }
    kernels::embedding_backward(exec, rows(s.input, batch), MatrixU<const T>(dres),
                                store_->grad_matrix(wte_), store_->grad_matrix(wpe_), vocab_first_);
    if (hooks_) {
      hooks_->after_backward(wpe_unit_);
      hooks_->after_backward(wte_unit_);
    }
  } else {
    Kokkos::deep_copy(exec, MatrixU<T>(s.dinput.data(), n, C), dres);
  }
}

template <class T>
LossSums Gpt<T>::loss(const ExecSpace& exec, int slot, VectorU<const std::int32_t> labels,
                      MatrixU<const T> /*targets*/, T scale) {
  const int batch = this->batch_of(slot);
  const auto n = static_cast<Index>(batch) * shape_.context;
  const Slot& s = slots_[std::size_t(slot)];
  const Index Vl = vocab_local_, first = vocab_first_, tp = part_.tp, t = part_.t;
  if (Index(labels.extent(0)) != n)
    throw std::invalid_argument(fmt::format("tessera::nn::Gpt::loss: {} labels for {} positions",
                                            labels.extent(0), n));
  const MatrixU<const T> logits(s.logits.data(), std::size_t(n), std::size_t(Vl));
  const MatrixU<T> dlogits(s.dlogits.data(), std::size_t(n), std::size_t(Vl));
  // xent: [tp][n][2] (max, sum of exp(l - max)) of each rank's vocabulary rows, then [n] the
  // target's logit (from the rank that holds it): summed over the group, zeros elsewhere.
  const VectorU<T> buf(xent_.data(), std::size_t(n * (2 * tp + 1)));
  Kokkos::deep_copy(exec, buf, T(0));
  Kokkos::parallel_for(
      "tessera::nn::Gpt::loss::local", Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<Index>>(exec, 0, n),
      KOKKOS_LAMBDA(const Index i) {
        const T* li = &logits(i, 0);
        T m = li[0];
        TESSERA_SIMD_REDUCTION(max : m)
        for (Index v = 1; v < Vl; ++v) m = li[v] > m ? li[v] : m;
        T sum = T(0);
        TESSERA_SIMD_REDUCTION(+ : sum)
        for (Index v = 0; v < Vl; ++v) sum += math::vexp(li[v] - m);
        buf((t * n + i) * 2) = m;
        buf((t * n + i) * 2 + 1) = sum;
        const Index target = Index(labels(i)) - first;
        if (target >= 0 && target < Vl) buf(tp * n * 2 + i) = logits(i, target);
      });
  if (tp > 1) {
    exec.fence();
    part_.tensor_sum(buf.data(), buf.size());
  }
  // Every rank now knows each row's global max M, sum S = sum_r s_r exp(m_r - M), target logit.
  const T per_token = scale / T(shape_.context);
  Kokkos::parallel_for(
      "tessera::nn::Gpt::loss::grad", Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<Index>>(exec, 0, n),
      KOKKOS_LAMBDA(const Index i) {
        T M = buf(i * 2);
        for (Index r = 1; r < tp; ++r) M = buf((r * n + i) * 2) > M ? buf((r * n + i) * 2) : M;
        T S = T(0);
        for (Index r = 0; r < tp; ++r) S += buf((r * n + i) * 2 + 1) * math::exp(buf((r * n + i) * 2) - M);
        const T c = per_token / S;
        const T* li = &logits(i, 0);
        T* di = &dlogits(i, 0);
        TESSERA_SIMD
        for (Index v = 0; v < Vl; ++v) di[v] = c * math::vexp(li[v] - M);
        const Index target = Index(labels(i)) - first;
        if (target >= 0 && target < Vl) di[target] -= per_token;
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
  return {loss_sum / shape_.context, correct / shape_.context};
}

template <class T>
void Gpt<T>::next_token_logits(const ExecSpace& exec, int slot, int positions, const MatrixU<T>& out) {
  if (!first_stage() || !last_stage())
    throw std::logic_error("tessera::nn::Gpt::next_token_logits needs the whole model on one stage");
  forward(exec, slot);  // causal: positions after `positions` do not change the earlier logits
  const int batch = this->batch_of(slot);
  const Slot& s = slots_[std::size_t(slot)];
  const Index Vl = vocab_local_, T_ = shape_.context, p = positions - 1;
  const MatrixU<const T> logits(s.logits.data(), std::size_t(batch) * std::size_t(T_), std::size_t(Vl));
  Kokkos::parallel_for(
      "tessera::nn::Gpt::next_token_logits",
      Kokkos::MDRangePolicy<ExecSpace, Kokkos::Rank<2>, Kokkos::IndexType<Index>>(exec, {0, 0}, {Index(batch), Vl}),
      KOKKOS_LAMBDA(const Index b, const Index v) { out(b, v) = logits(b * T_ + p, v); });
}

template class Gpt<float>;
template class Gpt<double>;

}  // namespace tessera::nn
