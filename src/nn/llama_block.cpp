// The Llama family's transformer block (nn/gpt.hpp; formulas in docs/models.md):
//   x1  = x + proj(attention(rope(q(n1)), rope(k(n1)), v(n1)))       n1 = rmsnorm_1(x)
//   out = x1 + mlp.proj(silu(gate(n2)) * up(n2))                      n2 = rmsnorm_2(x1)
// q, k, v, gate and up are column-parallel (their products into the compact buffers qkvc_ and
// the slot's fc), proj and mlp.proj row-parallel. The attention is the GPT's, on the operands
// kernels::rope_expand makes (every query head with its key/value head's k and v, rotated).
#include <fmt/format.h>

#include <type_traits>

#include "kernels/precision.hpp"
#include "kernels/rmsnorm.hpp"
#include "kernels/rope.hpp"
#include "kernels/swiglu.hpp"
#include "nn/attention.hpp"
#include "nn/gpt.hpp"

namespace tessera::nn {

namespace {

/// y = p + r (p the product, fp32 or bf16 read as its values; y may be p).
template <class RView, class PView, class YView>
void residual_add(const ExecSpace& exec, const RView& r, const PView& p, const YView& y) {
  for_rows("tessera::nn::llama::residual_add", exec, Index(y.extent(0)), Index(y.extent(1)),
           KOKKOS_LAMBDA(const Index i, const Index j) { y(i, j) = kernels::loaded(p(i, j)) + r(i, j); });
}

}  // namespace

template <class T>
template <class E>
std::array<MatrixU<E>, 3> Gpt<T>::parts(E* base, int tokens, std::array<int, 3> widths) {
  const auto n = std::size_t(tokens);
  std::array<MatrixU<E>, 3> out;
  std::size_t offset = 0;
  for (std::size_t i = 0; i < 3; ++i) {
    out[i] = MatrixU<E>(base + offset, n, std::size_t(widths[i]));
    offset += n * std::size_t(widths[i]);
  }
  return out;
}

template <class T>
template <class A>
void Gpt<T>::llama_forward_as(const ExecSpace& exec, const Block& b, const MatrixU<const T>& x, const Acts& a,
                              int tokens, const MatrixU<T>& out) const {
  const int batch = tokens / seq_;
  const auto n = std::size_t(tokens);
  const auto r = [&](const auto& m) { return first_rows(m, n); };
  const int qw = heads_local_ * hd_, kw = kv_local_ * hd_, Fl = ffn_local_;
  const MatrixU<T> x1 = r(a.x1);
  const VectorU<T> rstd1 = first(a.rstd1, n), rstd2 = first(a.rstd2, n);
  const Index Hl = heads_local_, KVl = kv_local_, seq = seq_;
  if constexpr (std::is_same_v<A, std::uint16_t>) {
    // bf16 from each RMSNorm to the residual stream: the products store bf16 outputs, the
    // rotation reads them and writes the attention's bf16 head blocks.
    const MatrixU<std::uint16_t> ln1 = r(a.ln1_16), ln2 = r(a.ln2_16), h = r(a.h16), y = r(a.y16);
    kernels::rmsnorm_forward(exec, x, store_->value(b.ln1_w), ln1, rstd1, shape_.norm_eps);
    const auto qkv = parts(qkvc16_.data(), tokens, {qw, kw, kw});
    b.qkv.forward_bf16(exec, Bf16Matrix(ln1), qkv[0]);
    b.k->forward_bf16(exec, Bf16Matrix(ln1), qkv[1]);
    b.v->forward_bf16(exec, Bf16Matrix(ln1), qkv[2]);
    kernels::rope_expand<float>(exec, qkv[0], qkv[1], qkv[2], rope_cos_, rope_sin_, Hl, KVl, seq,
                                kernels::HeadBlocks{a.qkv16.data(), Hl, Index(hd_), seq}, pos_);
    attention_forward_bf16(exec, a.qkv16.data(), y, batch_scores(a.att16, batch), shape_.window);
    const auto residual = [&](const Linear<T>& l, const MatrixU<std::uint16_t>& in, const MatrixU<const T>& res,
                              const MatrixU<T>& o) {
      if (l.split() == Split::row) {  // a partial product, summed over the tensor group in fp32
        l.forward_bf16(exec, Bf16Matrix(in), o, part_.tensor_sum, Linear<T>::Bias::caller);
        residual_add(exec, res, o, o);
      } else {
        const MatrixU<std::uint16_t> scratch = r(dy16_);
        l.forward_bf16(exec, Bf16Matrix(in), scratch, Linear<T>::Bias::caller);
        residual_add(exec, res, scratch, o);
      }
    };
    residual(b.proj, y, x, x1);
    kernels::rmsnorm_forward(exec, MatrixU<const T>(x1), store_->value(b.ln2_w), ln2, rstd2, shape_.norm_eps);
    const auto gu = parts(a.fc16.data(), tokens, {Fl, Fl, 0});
    b.fc.forward_bf16(exec, Bf16Matrix(ln2), gu[0]);
    b.up->forward_bf16(exec, Bf16Matrix(ln2), gu[1]);
    kernels::swiglu_forward<float>(exec, gu[0], gu[1], h);
    residual(b.mproj, h, MatrixU<const T>(x1), out);
  } else {
    const MatrixU<T> ln1 = r(a.ln1), ln2 = r(a.ln2), h = r(a.h), y = r(a.y);
    // The attention's operands: a.qkv, or under context parallelism working memory that attend
    // regroups into a.qkv.
    const MatrixU<T> qkv = regrouped() ? r(cp_qkv_) : r(a.qkv);
    kernels::rmsnorm_forward(exec, x, store_->value(b.ln1_w), ln1, rstd1, shape_.norm_eps);
    const auto c = parts(qkvc_.data(), tokens, {qw, kw, kw});
    b.qkv.forward(exec, MatrixU<const T>(ln1), c[0]);
    b.k->forward(exec, MatrixU<const T>(ln1), c[1]);
    b.v->forward(exec, MatrixU<const T>(ln1), c[2]);
    kernels::rope_expand<T>(exec, c[0], c[1], c[2], rope_cos_, rope_sin_, Hl, KVl, seq,
                            kernels::FusedHeads<MatrixU<T>>{qkv, Hl, Index(hd_)}, pos_);
    attend(exec, qkv, y, a, batch);
    b.proj.forward(exec, MatrixU<const T>(y), x1, part_.tensor_sum, Linear<T>::Bias::caller);
    residual_add(exec, x, x1, x1);
    kernels::rmsnorm_forward(exec, MatrixU<const T>(x1), store_->value(b.ln2_w), ln2, rstd2, shape_.norm_eps);
    const auto gu = parts(a.fc.data(), tokens, {Fl, Fl, 0});
    b.fc.forward(exec, MatrixU<const T>(ln2), gu[0]);
    b.up->forward(exec, MatrixU<const T>(ln2), gu[1]);
    kernels::swiglu_forward<T>(exec, gu[0], gu[1], h);
    b.mproj.forward(exec, MatrixU<const T>(h), out, part_.tensor_sum, Linear<T>::Bias::caller);
    residual_add(exec, MatrixU<const T>(x1), out, out);
  }
}

template <class T>
template <class A>
void Gpt<T>::llama_backward_as(const ExecSpace& exec, const Block& b, const MatrixU<const T>& x, const Acts& a,
                               int tokens, const MatrixU<T>& dres) const {
  // dres: the gradient of the block's output in, of its input out.
  const int batch = tokens / seq_;
  const auto n = std::size_t(tokens);
  const auto r = [&](const auto& m) { return first_rows(m, n); };
  const int qw = heads_local_ * hd_, kw = kv_local_ * hd_, Fl = ffn_local_;
  const MatrixU<T> d1 = r(d1_), dln = r(dln_);
  const VectorU<T> rstd1 = first(a.rstd1, n), rstd2 = first(a.rstd2, n);
  const Index Hl = heads_local_, KVl = kv_local_, seq = seq_;
  const auto shared_input = [&](const std::array<const Linear<T>*, 3>& layers, const auto& in, const auto& grads) {
    // The layers reading one normalised input: their input gradients summed into dln, then over
    // the tensor group once.
    bool accumulate = false;
    for (std::size_t i = 0; i < 3; ++i) {
      if (layers[i] == nullptr) continue;
      layers[i]->backward_shared(exec, in, grads[i], dln, accumulate);
      accumulate = true;
    }
    tensor_sum(exec, dln);
  };
  if constexpr (std::is_same_v<A, std::uint16_t>) {
    const MatrixU<std::uint16_t> dh = r(dh16_), dy = r(dy16_), dqkv = r(dqkv16_);
    const auto gu = parts(a.fc16.data(), tokens, {Fl, Fl, 0});
    const auto dgu = parts(dgu16_.data(), tokens, {Fl, Fl, 0});
    b.mproj.backward_bf16(exec, Bf16Matrix(r(a.h16)), MatrixU<const T>(dres), dh);
    kernels::swiglu_backward<float>(exec, gu[0], gu[1], dh, dgu[0], dgu[1]);
    shared_input({&b.fc, &*b.up, nullptr}, Bf16Matrix(r(a.ln2_16)),
                 std::array<Bf16Matrix, 3>{Bf16Matrix(dgu[0]), Bf16Matrix(dgu[1]), Bf16Matrix()});
    kernels::rmsnorm_backward(exec, r(a.x1), store_->value(b.ln2_w), rstd2, dln, d1, store_->grad(b.ln2_w), dres);
    b.proj.backward_bf16(exec, Bf16Matrix(r(a.y16)), MatrixU<const T>(d1), dy);
    attention_backward_bf16(exec, a.qkv16.data(), batch_scores(a.att16, batch), dy, dqkv,
                            batch_scores(dscores16_, batch), shape_.window);
    const auto dc = parts(qkvc16_.data(), tokens, {qw, kw, kw});
    kernels::rope_reduce<float>(exec, kernels::FusedHeads<MatrixU<std::uint16_t>>{dqkv, Hl, Index(hd_)}, rope_cos_,
                                rope_sin_, Hl, KVl, seq, dc[0], dc[1], dc[2], pos_);
    shared_input({&b.qkv, &*b.k, &*b.v}, Bf16Matrix(r(a.ln1_16)),
                 std::array<Bf16Matrix, 3>{Bf16Matrix(dc[0]), Bf16Matrix(dc[1]), Bf16Matrix(dc[2])});
    kernels::rmsnorm_backward(exec, x, store_->value(b.ln1_w), rstd1, dln, dres, store_->grad(b.ln1_w), d1);
  } else {
    const MatrixU<T> dh = r(dh_), dy = r(dy_), dqkv = r(dqkv_);
    const auto gu = parts(a.fc.data(), tokens, {Fl, Fl, 0});
    const auto dgu = parts(dgu_.data(), tokens, {Fl, Fl, 0});
    b.mproj.backward(exec, MatrixU<const T>(r(a.h)), MatrixU<const T>(dres), dh, Linear<T>::Bias::caller);
    kernels::swiglu_backward<T>(exec, gu[0], gu[1], dh, dgu[0], dgu[1]);
    shared_input({&b.fc, &*b.up, nullptr}, MatrixU<const T>(r(a.ln2)),
                 std::array<MatrixU<const T>, 3>{dgu[0], dgu[1], MatrixU<const T>()});
    kernels::rmsnorm_backward(exec, r(a.x1), store_->value(b.ln2_w), rstd2, dln, d1, store_->grad(b.ln2_w), dres);
    b.proj.backward(exec, MatrixU<const T>(r(a.y)), MatrixU<const T>(d1), dy, Linear<T>::Bias::caller);
    attend_backward(exec, a, dy, dqkv, batch);
    const auto dc = parts(qkvc_.data(), tokens, {qw, kw, kw});
    kernels::rope_reduce<T>(exec, kernels::FusedHeads<MatrixU<T>>{dqkv, Hl, Index(hd_)}, rope_cos_, rope_sin_, Hl,
                            KVl, seq, dc[0], dc[1], dc[2], pos_);
    shared_input({&b.qkv, &*b.k, &*b.v}, MatrixU<const T>(r(a.ln1)),
                 std::array<MatrixU<const T>, 3>{dc[0], dc[1], dc[2]});
    kernels::rmsnorm_backward(exec, x, store_->value(b.ln1_w), rstd1, dln, dres, store_->grad(b.ln1_w), d1);
  }
}

#define TESSERA_LLAMA_BLOCK(T, A)                                                                                   \
  template void Gpt<T>::llama_forward_as<A>(const ExecSpace&, const Block&, const MatrixU<const T>&, const Acts&,  \
                                            int, const MatrixU<T>&) const;                                         \
  template void Gpt<T>::llama_backward_as<A>(const ExecSpace&, const Block&, const MatrixU<const T>&, const Acts&, \
                                             int, const MatrixU<T>&) const;
TESSERA_LLAMA_BLOCK(float, float)
TESSERA_LLAMA_BLOCK(float, std::uint16_t)
TESSERA_LLAMA_BLOCK(double, double)
#undef TESSERA_LLAMA_BLOCK

}  // namespace tessera::nn
