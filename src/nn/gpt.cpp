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
#include "kernels/precision.hpp"
#include "kernels/rmsnorm.hpp"
#include "kernels/rope.hpp"
#include "kernels/simd.hpp"

namespace tessera::nn {

namespace {

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
  if (shape_.window < 0)
    throw std::invalid_argument(fmt::format("tessera::nn::Gpt: a window of {} positions", shape_.window));
  heads_local_ = shape_.heads / tp;
  hd_ = C / shape_.heads;
  const int sp = part_.sp;
  ring_ = sp > 1 && part_.ring;
  const bool head_tail = part_.head_tail;
  if (head_tail != (ring_ && shape_.window == 0))
    throw std::invalid_argument("tessera::nn::Gpt: the ring takes head and tail chunks without a window, one block "
                                "with one (Part::head_tail)");
  if (sp < 1 || part_.s < 0 || part_.s >= sp || shape_.context % (head_tail ? 2 * sp : sp) != 0 ||
      (!ring_ && heads_local_ % sp != 0))
    throw std::invalid_argument(fmt::format("tessera::nn::Gpt: context {} and {} heads per tensor rank over {} "
                                            "context ranks ({})", shape_.context, heads_local_, sp,
                                            ring_ ? "ring" : "all-to-all"));
  if (sp > 1 && !part_.spatial_sum)
    throw std::invalid_argument("tessera::nn::Gpt: context parallelism needs spatial_sum");
  if (sp > 1 && (ring_ ? !part_.messages || !part_.wait : !part_.all_to_all))
    throw std::invalid_argument("tessera::nn::Gpt: context parallelism needs its all_to_all or messages and wait");
  if (sp > 1 && fused_attention)
    throw InputError("parallel.spatial: context parallelism of a transformer is not built for a GPU build yet "
                     "(its all-to-all and ring run on host memory); set parallel.spatial = 1");
  seq_ = shape_.context / sp;
  if (head_tail) {
    const int c = seq_ / 2;
    pos_ = kernels::Positions(part_.s * c, c, (2 * sp - 1 - part_.s) * c);
  } else {
    pos_ = kernels::Positions(part_.s * seq_);
  }
  att_heads_ = ring_ ? heads_local_ : heads_local_ / sp;
  if (shape_.llama) {
    if (shape_.kv_heads < 1 || shape_.heads % shape_.kv_heads != 0 || shape_.kv_heads % tp != 0 ||
        shape_.ffn < 1 || shape_.ffn % tp != 0 || hd_ % 2 != 0)
      throw std::invalid_argument(fmt::format("tessera::nn::Gpt: llama with {} heads, {} key/value heads, MLP "
                                              "width {}, head width {} on {} tensor ranks", shape_.heads,
                                              shape_.kv_heads, shape_.ffn, hd_, tp));
    kv_local_ = shape_.kv_heads / tp;
    ffn_local_ = shape_.ffn / tp;
  } else if (!shape_.tied) {
    throw std::invalid_argument("tessera::nn::Gpt: GPT-2's head is always tied to wte");
  }
  vocab_local_ = shape_.vocab / tp;
  vocab_first_ = t * vocab_local_;
  const std::int64_t V = shape_.vocab, Vl = vocab_local_;
  const double std_init = 0.02, std_proj = 0.02 / std::sqrt(2.0 * L);  // GPT-2's scaled residual init
  const Placement vocab_rows{{V, C}, {std::int64_t(t) * Vl, 0}, tp > 1, Tie::none};
  const bool tied_across_stages = shape_.tied && first_stage() != last_stage();

  if (first_stage()) {
    store.begin_unit(/*solo=*/true);
    wte_unit_ = store.units() - 1;
    Placement p = vocab_rows;
    p.tie = tied_across_stages ? Tie::original : Tie::none;
    wte_ = store.add("wte.weight", {Vl, C}, InitKind::normal, std_init, p);
    if (!shape_.llama) {
      store.begin_unit();
      wpe_unit_ = store.units() - 1;
      wpe_ = store.add("wpe.weight", {shape_.context, C}, InitKind::normal, std_init);
    }
  }
  typename Linear<T>::Options column{1, false, InitKind::normal, std_init, true, part_.precision};
  typename Linear<T>::Options qkv_opts = column;
  qkv_opts.groups = 3;
  typename Linear<T>::Options row{1, false, InitKind::normal, std_proj, true, part_.precision};
  typename Linear<T>::Options llama_column = column, llama_row = row;
  llama_column.bias = llama_row.bias = false;
  for (int i = first_; i < end_ && shape_.llama; ++i) {
    const std::string n = fmt::format("blocks.{}", i);
    store.begin_unit();
    const std::size_t unit = store.units() - 1;
    const std::size_t ln1_w = store.add(n + ".ln_1.weight", {C}, InitKind::ones);
    const int kv = shape_.kv_heads * hd_;
    Linear<T> q(store, n + ".attn.q", C, C, Split::column, tp, t, llama_column);
    Linear<T> k(store, n + ".attn.k", C, kv, Split::column, tp, t, llama_column);
    Linear<T> v(store, n + ".attn.v", C, kv, Split::column, tp, t, llama_column);
    Linear<T> proj(store, n + ".attn.proj", C, C, Split::row, tp, t, llama_row);
    const std::size_t ln2_w = store.add(n + ".ln_2.weight", {C}, InitKind::ones);
    Linear<T> gate(store, n + ".mlp.gate", C, shape_.ffn, Split::column, tp, t, llama_column);
    Linear<T> up(store, n + ".mlp.up", C, shape_.ffn, Split::column, tp, t, llama_column);
    Linear<T> down(store, n + ".mlp.proj", shape_.ffn, C, Split::row, tp, t, llama_row);
    blocks_.push_back(Block{unit, ln1_w, npos, ln2_w, npos, q, proj, gate, down, k, v, up});
  }
  for (int i = first_; i < end_ && !shape_.llama; ++i) {
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
    blocks_.push_back(Block{unit, ln1_w, ln1_b, ln2_w, ln2_b, qkv, proj, fc, mproj, {}, {}, {}});
  }
  if (last_stage()) {
    store.begin_unit();
    lnf_unit_ = store.units() - 1;
    lnf_w_ = store.add("ln_f.weight", {C}, InitKind::ones);
    if (!shape_.llama) lnf_b_ = store.add("ln_f.bias", {C}, InitKind::zeros);
    if (!shape_.tied) {
      store.begin_unit(/*solo=*/true);
      lm_head_unit_ = store.units() - 1;
      lm_head_ = store.add("lm_head.weight", {Vl, C}, InitKind::normal, std_init, vocab_rows);
    }
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
std::size_t Gpt<T>::mlp_local() const {
  return shape_.llama ? std::size_t(ffn_local_) : 4 * std::size_t(shape_.width / part_.tp);
}

template <class T>
std::size_t Gpt<T>::fc_local() const {
  return shape_.llama ? 2 * std::size_t(ffn_local_) : mlp_local();
}

template <class T>
int Gpt<T>::input_width() const {
  return first_stage() ? seq_ : seq_ * shape_.width;
}

template <class T>
int Gpt<T>::output_width() const {
  return seq_ * (last_stage() ? vocab_local_ : shape_.width);
}

template <class T>
typename Gpt<T>::Acts Gpt<T>::make_acts(const char* what) const {
  const auto n = static_cast<std::size_t>(this->max_batch()) * static_cast<std::size_t>(seq_);
  const auto C = static_cast<std::size_t>(shape_.width);
  const auto Cl = C / static_cast<std::size_t>(part_.tp);
  const std::string w(what);
  Acts a;
  if (bf16_acts_) {  // what only products read, in bf16
    a.ln1_16 = alloc_matrix<std::uint16_t>(w + ".ln1 (bf16)", n, C);
    a.ln2_16 = alloc_matrix<std::uint16_t>(w + ".ln2 (bf16)", n, C);
    a.h16 = alloc_matrix<std::uint16_t>(w + ".h (bf16)", n, mlp_local());
    a.qkv16 = alloc_matrix<std::uint16_t>(w + ".qkv (bf16 head blocks)", n, 3 * Cl);
    a.y16 = alloc_matrix<std::uint16_t>(w + ".y (bf16)", n, Cl);
    a.att16 = scores<std::uint16_t>(w + ".att (bf16)");
  } else {
    a.ln1 = alloc_matrix<T>(w + ".ln1", n, C);
    a.ln2 = alloc_matrix<T>(w + ".ln2", n, C);
    a.h = alloc_matrix<T>(w + ".h", n, mlp_local());
    a.qkv = alloc_matrix<T>(w + ".qkv", n, 3 * Cl);
    a.y = alloc_matrix<T>(w + ".y", n, Cl);
    a.att = scores<T>(w + ".att");
  }
  a.x1 = alloc_matrix<T>(w + ".x1", n, C);
  if (shape_.llama && bf16_acts_) a.fc16 = alloc_matrix<std::uint16_t>(w + ".gate, up (bf16)", n, fc_local());
  else a.fc = alloc_matrix<T>(w + ".fc", n, fc_local());
  if (!shape_.llama) a.mean1 = alloc_vector<T>(w + ".mean1", n);
  a.rstd1 = alloc_vector<T>(w + ".rstd1", n);
  if (!shape_.llama) a.mean2 = alloc_vector<T>(w + ".mean2", n);
  a.rstd2 = alloc_vector<T>(w + ".rstd2", n);
  return a;
}

template <class T>
template <class E>
Kokkos::View<E****, Kokkos::LayoutRight, MemSpace> Gpt<T>::scores(const std::string& what) const {
  const auto [score_rows, score_width] = scores_extents();
  return Kokkos::View<E****, Kokkos::LayoutRight, MemSpace>(
      Kokkos::view_alloc(mem::label(mem::Category::act, "tessera::nn::Gpt::" + what), Kokkos::WithoutInitializing),
      static_cast<std::size_t>(this->max_batch()), static_cast<std::size_t>(att_heads_), score_rows, score_width);
}

template <class T>
std::array<std::size_t, 2> Gpt<T>::scores_extents() const {
  // The ring keeps each of its rows' log-sum-exp (nn/context_ring.cpp); otherwise every position
  // of the sequence, and the probabilities (or the fused attention's statistics).
  if (ring_) return {std::size_t(seq_), 1};
  const auto Tn = static_cast<std::size_t>(shape_.context);
  return {Tn, attention_scores_width(Tn)};
}

template <class T>
void Gpt<T>::add_slot() {
  const auto B = static_cast<std::size_t>(this->max_batch());
  const auto Tn = static_cast<std::size_t>(seq_), C = static_cast<std::size_t>(shape_.width);
  const std::size_t n = B * Tn;
  const std::size_t nb = blocks_.size();
  if (slots_.empty()) bf16_acts_ = keeps_bf16_activations();
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
    if (!shape_.llama) s.meanf = alloc_vector<T>("ln_f.mean", n);
    s.rstdf = alloc_vector<T>("ln_f.rstd", n);
    const std::size_t width = Tn * static_cast<std::size_t>(vocab_local_);
    if (bf16_acts_) {
      s.logits16 = alloc_matrix<std::uint16_t>("logits (bf16)", B, width);
      s.dlogits16 = alloc_matrix<std::uint16_t>("dlogits (bf16)", B, width);
    } else {
      s.logits = alloc_matrix<T>("logits", B, width);
      s.dlogits = alloc_matrix<T>("dlogits", B, width);
    }
  } else {
    s.doutput = alloc_matrix<T>("doutput", B, Tn * C);
  }
  if (!first_stage()) s.dinput = alloc_matrix<T>("dinput", B, Tn * C);
  if (slots_.size() == 1) {  // the shared working set, once
    const auto Cl = C / static_cast<std::size_t>(part_.tp);
    if (shape_.llama) {  // the rotation tables, with the working set (counted as activations)
      std::vector<T> c, sn;
      kernels::rope_tables(shape_.context, hd_, shape_.rope_theta, c, sn);
      const auto table = [&](const char* what, const std::vector<T>& host) {
        Vector<T> v = alloc_vector<T>(what, host.size());
        Kokkos::deep_copy(v, Kokkos::View<const T*, HostSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>>(host.data(),
                                                                                                           host.size()));
        return v;
      };
      rope_cos_ = table("rope.cos", c);
      rope_sin_ = table("rope.sin", sn);
    }
    if (part_.recompute) work_ = make_acts("recompute");
    dres_ = alloc_matrix<T>("dres", n, C);
    d1_ = alloc_matrix<T>("d1", n, C);
    if (bf16_acts_) {
      dh16_ = alloc_matrix<std::uint16_t>("dh (bf16)", n, mlp_local());
      dy16_ = alloc_matrix<std::uint16_t>("dy (bf16)", n, Cl);
      dqkv16_ = alloc_matrix<std::uint16_t>("dqkv (bf16)", n, 3 * Cl);
      dscores16_ = scores<std::uint16_t>("dscores (bf16)");
      if (part_.tp > 1 || shape_.llama) dln_ = alloc_matrix<T>("dln", n, C);
      else dln16_ = alloc_matrix<std::uint16_t>("dln (bf16)", n, C);
      if (shape_.llama) {
        qkvc16_ = alloc_matrix<std::uint16_t>("q, k, v (bf16)", n, qkv_compact());
        dgu16_ = alloc_matrix<std::uint16_t>("dgate, dup (bf16)", n, fc_local());
      }
    } else {
      dln_ = alloc_matrix<T>("dln", n, C);
      dqkv_ = alloc_matrix<T>("dqkv", n, 3 * Cl);
      dy_ = alloc_matrix<T>("dy", n, Cl);
      dh_ = alloc_matrix<T>("dh", n, mlp_local());
      dscores_ = scores<T>("dscores");
      if (shape_.llama) {
        qkvc_ = alloc_matrix<T>("q, k, v", n, qkv_compact());
        dgu_ = alloc_matrix<T>("dgate, dup", n, fc_local());
      }
    }
    dhf_ = alloc_matrix<T>("dhf", n, C);
    if (ring_) {  // nn/context_ring.cpp
      const std::size_t kv = 2 * std::size_t(ring_kv_heads()) * std::size_t(hd_), heads = std::size_t(heads_local_);
      const std::size_t blocks = ring_kv_rows(this->max_batch());
      ring_kv_ = alloc_matrix<T>("context: keys, values (ring)", blocks, kv);
      ring_dkv_ = alloc_matrix<T>("context: their gradients (ring)", ring_dkv_rows(this->max_batch()), kv);
      ring_s_ = alloc_matrix<T>("context: block scores (ring)", n * heads, Tn);
      ring_ds_ = alloc_matrix<T>("context: block score gradients (ring)", n * heads, Tn);
    } else if (part_.sp > 1) {
      cp_qkv_ = alloc_matrix<T>("context: qkv", n, 3 * Cl);
      cp_y_ = alloc_matrix<T>("context: y", n, Cl);
      cp_send_ = alloc_matrix<T>("context: send", n, 3 * Cl);
      cp_recv_ = alloc_matrix<T>("context: receive", n, 3 * Cl);
    }
    xent_ = alloc_vector<T>("xent", n * static_cast<std::size_t>(2 * part_.tp + 1));
  }
}

template <class T>
double Gpt<T>::activation_bytes(int max_batch, int slots) const {
  // What add_slot() and make_acts() allocate, buffer by buffer (bf16 as add_slot() decides it
  // with the first slot): bytes of n x w elements of T, or of the bf16-or-T type p.
  const bool bf16 = keeps_bf16_activations();
  const double B = max_batch, Tn = seq_, n = B * Tn, C = shape_.width, Cl = C / part_.tp;
  const double f = sizeof(T), h = sizeof(std::uint16_t), p = bf16 ? h : f;
  const auto bytes = [](double elements, double size) { return mem::view_bytes(elements, size); };
  // The scores, for the heads this rank's attention runs (scores_extents).
  const auto [score_rows, score_width] = scores_extents();
  const double scores = B * att_heads_ * double(score_rows) * double(score_width);
  // Context parallelism's working set: all-to-all, the local qkv, the gathered y, the all-to-all's
  // buffers; ring, the keys' and values' buffers and their gradients' (ring_kv_rows, ring_dkv_rows),
  // a block's scores and their gradients.
  const double kv = 2.0 * ring_kv_heads() * hd_;
  const double context = ring_             ? bytes(double(ring_kv_rows(max_batch)) * kv, f) +
                                                 bytes(double(ring_dkv_rows(max_batch)) * kv, f) +
                                                 2 * bytes(n * heads_local_ * Tn, f)
                         : part_.sp > 1 ? 3 * bytes(n * 3 * Cl, f) + bytes(n * Cl, f)
                                        : 0.0;
  if (shape_.llama) {
    // As below, with the llama's widths: h (F/tp) and gate, up (2F/tp, in p) in place of the
    // GELU's 4C/tp pair, two row statistics per block (RMSNorm's rstd) and one for ln_f; the
    // working set adds dln in T, the compact q, k, v and the gate's and up's gradients.
    const double Fl = double(mlp_local()), Gl = double(fc_local()), qc = double(qkv_compact());
    const double acts = 2 * bytes(n * C, p) + bytes(n * Fl, p) + bytes(n * 3 * Cl, p) + bytes(n * Cl, p) +
                        bytes(scores, p) + bytes(n * C, f) + bytes(n * Gl, p) + 2 * bytes(n, f);
    double slot = bytes(B * input_width(), f) + (first_stage() ? bytes(n * C, f) : 0.0);
    slot += double(blocks_.size()) * (bytes(n * C, f) + (part_.recompute ? 0.0 : acts));
    slot += last_stage() ? bytes(n * C, p) + bytes(n, f) + 2 * bytes(n * vocab_local_, p) : bytes(n * C, f);
    if (!first_stage()) slot += bytes(n * C, f);
    const double e = bf16 ? h : f;
    const double shared = (part_.recompute ? acts : 0.0) + 4 * bytes(n * C, f) + bytes(n * (2 * part_.tp + 1), f) +
                          bytes(n * Fl, e) + bytes(n * Cl, e) + bytes(n * 3 * Cl, e) + bytes(scores, e) +
                          bytes(n * qc, e) + bytes(n * Gl, e) + 2 * bytes(double(shape_.context) * (hd_ / 2), f) +
                          context;  // + the RoPE tables
    return double(slots) * slot + shared;
  }
  // One block's tensors: ln1, ln2, h, qkv, y, att in p; x1, fc, four row statistics in T.
  const double acts = 2 * bytes(n * C, p) + bytes(n * 4 * Cl, p) + bytes(n * 3 * Cl, p) + bytes(n * Cl, p) +
                      bytes(scores, p) + bytes(n * C, f) + bytes(n * 4 * Cl, f) + 4 * bytes(n, f);
  // A slot: its input (token ids, or the previous stage's activations, which x[0] then is), x[0]
  // on the first stage; each block's output and (without recompute) tensors; on the last stage
  // ln_f (p), its statistics and the logits and their gradient (p), elsewhere doutput; dinput
  // past the first stage.
  double slot = bytes(B * input_width(), f) + (first_stage() ? bytes(n * C, f) : 0.0);
  slot += double(blocks_.size()) * (bytes(n * C, f) + (part_.recompute ? 0.0 : acts));
  slot += last_stage() ? bytes(n * C, p) + 2 * bytes(n, f) + 2 * bytes(n * vocab_local_, p) : bytes(n * C, f);
  if (!first_stage()) slot += bytes(n * C, f);
  // The working set: one block's tensors with recompute; dres, d1, dhf and the loss's sums in T;
  // dh, dy, dqkv, dscores in bf16 and dln (in T where a tensor group sums it), or all in T.
  double shared = (part_.recompute ? acts : 0.0) + 3 * bytes(n * C, f) + bytes(n * (2 * part_.tp + 1), f) + context;
  if (bf16)
    shared += bytes(n * 4 * Cl, h) + bytes(n * Cl, h) + bytes(n * 3 * Cl, h) + bytes(scores, h) +
              bytes(n * C, part_.tp > 1 ? f : h);
  else
    shared += bytes(n * C, f) + bytes(n * 3 * Cl, f) + bytes(n * Cl, f) + bytes(n * 4 * Cl, f) + bytes(scores, f);
  return double(slots) * slot + shared;
}

template <class T>
void Gpt<T>::clear_slots() {
  slots_.clear();
  work_ = Acts{};
  dh16_ = dy16_ = dqkv16_ = dln16_ = qkvc16_ = dgu16_ = Matrix<std::uint16_t>();
  dln_ = dqkv_ = dy_ = dh_ = qkvc_ = dgu_ = cp_qkv_ = cp_y_ = cp_send_ = cp_recv_ = Matrix<T>();
  ring_kv_ = ring_dkv_ = ring_s_ = ring_ds_ = Matrix<T>();
  rope_cos_ = rope_sin_ = Vector<T>();
  dscores_ = {};
  dscores16_ = {};
}

template <class T>
MatrixU<T> Gpt<T>::tokens_rows(const Matrix<T>& m, int tokens) const {
  return first_rows(m, std::size_t(tokens));
}

template <class T>
const Matrix<T>& Gpt<T>::fp32_logits(const Matrix<T>& m) const {
  if (bf16_acts_)
    throw std::logic_error("tessera::nn::Gpt: the last stage keeps its logits and their gradient in bf16 "
                           "(train.precision = bf16 on a bf16 GEMM); next_token_logits reads them");
  return m;
}

template <class T>
bool Gpt<T>::keeps_bf16_activations() const {
  // Context parallelism's attention (the all-to-all's regroup, the ring's blocks) reads fp32
  // operands: under bf16 its products still take bf16 operands (rounded as they read them),
  // while the activations stay fp32.
  return bf16_activations<T>(part_.precision) && part_.sp == 1;
}

template <class T>
bool Gpt<T>::bf16_acts() const {
  return checked_bf16_activations(bf16_acts_, part_.precision, "Gpt");
}

template <class T>
MatrixU<T> Gpt<T>::input(int slot) const {
  return rows(slots_[std::size_t(slot)].input, this->batch_of(slot));
}

template <class T>
MatrixU<T> Gpt<T>::output(int slot) const {
  const int batch = this->batch_of(slot);
  const Slot& s = slots_[std::size_t(slot)];
  if (last_stage()) return rows(fp32_logits(s.logits), batch);
  return MatrixU<T>(s.x.back().data(), static_cast<std::size_t>(batch),
                    static_cast<std::size_t>(output_width()));
}

template <class T>
MatrixU<T> Gpt<T>::grad_output(int slot) const {
  const int batch = this->batch_of(slot);
  const Slot& s = slots_[std::size_t(slot)];
  return rows(last_stage() ? fp32_logits(s.dlogits) : s.doutput, batch);
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
  const bool positions = wpe_ != npos;
  if (hooks_) {
    hooks_->before_forward(wte_unit_);
    if (positions) hooks_->before_forward(wpe_unit_);
  }
  kernels::embedding_forward(exec, tokens, store_->value_matrix(wte_),
                             positions ? store_->value_matrix(wpe_) : MatrixU<T>(), x, vocab_first_,
                             positions && part_.t == 0, pos_);
  tensor_sum(exec, x);  // one rank added the positions, each its vocabulary rows
  if (hooks_) {
    if (positions) hooks_->after_forward(wpe_unit_);
    hooks_->after_forward(wte_unit_);
  }
}

template <class T>
void Gpt<T>::block_forward(const ExecSpace& exec, const Block& b, const MatrixU<const T>& x,
                           const Acts& a, int tokens, const MatrixU<T>& out) const {
  if constexpr (std::is_same_v<T, float>) {
    if (bf16_acts())
      return shape_.llama ? llama_forward_as<std::uint16_t>(exec, b, x, a, tokens, out)
                          : block_forward_as<std::uint16_t>(exec, b, x, a, tokens, out);
  }
  if (shape_.llama) llama_forward_as<T>(exec, b, x, a, tokens, out);
  else block_forward_as<T>(exec, b, x, a, tokens, out);
}

template <class T>
void Gpt<T>::block_backward(const ExecSpace& exec, const Block& b, const MatrixU<const T>& x,
                            const Acts& a, int tokens, const MatrixU<T>& dres) const {
  if constexpr (std::is_same_v<T, float>) {
    if (bf16_acts())
      return shape_.llama ? llama_backward_as<std::uint16_t>(exec, b, x, a, tokens, dres)
                          : block_backward_as<std::uint16_t>(exec, b, x, a, tokens, dres);
  }
  if (shape_.llama) llama_backward_as<T>(exec, b, x, a, tokens, dres);
  else block_backward_as<T>(exec, b, x, a, tokens, dres);
}

template <class T>
template <class A>
void Gpt<T>::block_forward_as(const ExecSpace& exec, const Block& b, const MatrixU<const T>& x,
                              const Acts& a, int tokens, const MatrixU<T>& out) const {
  const int batch = tokens / seq_;
  const auto r = [&](const auto& m) { return first_rows(m, std::size_t(tokens)); };
  const MatrixU<T> x1 = r(a.x1), fc = r(a.fc);
  const MatrixU<A> ln1 = r(pick<A>(a.ln1, a.ln1_16)), ln2 = r(pick<A>(a.ln2, a.ln2_16)),
                   h = r(pick<A>(a.h, a.h16)), y = r(pick<A>(a.y, a.y16));
  kernels::layernorm_forward(exec, x, store_->value(b.ln1_w), store_->value(b.ln1_b), ln1,
                             first(a.mean1, std::size_t(tokens)), first(a.rstd1, std::size_t(tokens)));
  // The biases of proj, fc and mproj come in the kernels after their products (one pass
  // fewer over each output).
  if constexpr (std::is_same_v<A, std::uint16_t>) {
    // In bf16 from LayerNorm to the residual stream: the products store their outputs in bf16
    // (rounded once, as the float products' were) in backward's bf16 buffers, free until then:
    // qkv (its bias in the product) in dqkv16_, copied into head blocks; proj's and mproj's
    // products in dy16_; fc's in dh16_.
    const MatrixU<std::uint16_t> qkv16 = r(dqkv16_), fc16 = r(dh16_);
    b.qkv.forward_bf16(exec, Bf16Matrix(ln1), qkv16);
    qkv_to_bf16(exec, Bf16Matrix(qkv16), heads_local_, seq_, a.qkv16.data());
    attention_forward_bf16(exec, a.qkv16.data(), y, batch_scores(a.att16, batch), shape_.window);
    residual_forward_bf16(exec, b.proj, Bf16Matrix(y), x, x1, r(dy16_));
    kernels::layernorm_forward(exec, MatrixU<const T>(x1), store_->value(b.ln2_w), store_->value(b.ln2_b),
                               ln2, first(a.mean2, std::size_t(tokens)), first(a.rstd2, std::size_t(tokens)));
    b.fc.forward_bf16(exec, Bf16Matrix(ln2), fc16, Linear<T>::Bias::caller);
    kernels::gelu_forward_saving_derivative(exec, store_->value(b.fc.bias_index()), fc16, h, fc, shape_.gelu_tanh);
    residual_forward_bf16(exec, b.mproj, Bf16Matrix(h), MatrixU<const T>(x1), out, r(dy16_));
  } else {
    const MatrixU<T> qkv = r(a.qkv);
    // Under context parallelism the product goes to working memory and a.qkv gets the operands
    // regrouped by heads (attend).
    const MatrixU<T> product = regrouped() ? r(cp_qkv_) : qkv;
    linear_forward(exec, b.qkv, ln1, product, part_.tensor_sum);
    attend(exec, product, y, a, batch);
    b.proj.forward(exec, y, x1, part_.tensor_sum, Linear<T>::Bias::caller);
    kernels::bias_residual_add(exec, store_->value(b.proj.bias_index()), x, x1);
    kernels::layernorm_forward(exec, MatrixU<const T>(x1), store_->value(b.ln2_w), store_->value(b.ln2_b),
                               ln2, first(a.mean2, std::size_t(tokens)), first(a.rstd2, std::size_t(tokens)));
    linear_forward(exec, b.fc, ln2, fc, part_.tensor_sum, Linear<T>::Bias::caller);
    kernels::gelu_forward_saving_derivative(exec, store_->value(b.fc.bias_index()), fc, h, fc,
                                            shape_.gelu_tanh);  // fc: gelu' from here on
    linear_forward(exec, b.mproj, h, out, part_.tensor_sum, Linear<T>::Bias::caller);
    kernels::bias_residual_add(exec, store_->value(b.mproj.bias_index()), x1, out);
  }
}

template <class T>
void Gpt<T>::residual_forward_bf16(const ExecSpace& exec, const Linear<T>& l, const Bf16Matrix& in,
                                   const MatrixU<const T>& res, const MatrixU<T>& out,
                                   const MatrixU<std::uint16_t>& scratch) const {
  const auto bias = store_->value(l.bias_index());
  if (l.split() == Split::row) {  // a partial product, summed over the tensor group in fp32
    l.forward_bf16(exec, in, out, part_.tensor_sum, Linear<T>::Bias::caller);
    kernels::bias_residual_add(exec, bias, res, out);
  } else {
    l.forward_bf16(exec, in, scratch, Linear<T>::Bias::caller);
    kernels::bias_residual_add(exec, bias, res, scratch, out);
  }
}

template <class T>
template <class A>
void Gpt<T>::block_backward_as(const ExecSpace& exec, const Block& b, const MatrixU<const T>& x,
                               const Acts& a, int tokens, const MatrixU<T>& dres) const {
  // dres: the gradient of the block's output in, of its input out.
  const int batch = tokens / seq_;
  const auto r = [&](const auto& m) { return first_rows(m, std::size_t(tokens)); };
  const MatrixU<T> d1 = r(d1_);
  // After each column-parallel layer (fc, qkv), the LayerNorm before it: the input gradient of
  // the layer (dln) through the LayerNorm into dx, plus the residual stream's gradient res.
  const auto layernorm_backward = [&](const MatrixU<const T>& in, std::size_t w, std::size_t bias, const auto& mean,
                                      const auto& rstd, const auto& dln, const MatrixU<T>& dx, const auto& res) {
    kernels::layernorm_backward(exec, in, store_->value(w), first(mean, std::size_t(tokens)),
                                first(rstd, std::size_t(tokens)), dln, dx, store_->grad(w), store_->grad(bias), res);
  };
  if constexpr (std::is_same_v<A, std::uint16_t>) {
    // In bf16 from the residual stream's gradient to the LayerNorms': the products store the
    // input gradients in bf16 (a column-parallel layer's under tensor parallelism excepted: a
    // partial sum, summed in fp32).
    const MatrixU<std::uint16_t> dh16 = r(dh16_), dy16 = r(dy16_), dqkv16 = r(dqkv16_);
    const auto column_backward = [&](const Linear<T>& l, const MatrixU<std::uint16_t>& in,
                                     const MatrixU<std::uint16_t>& dout, const MatrixU<const T>& xin,
                                     std::size_t w, std::size_t bias, const auto& mean, const auto& rstd,
                                     const MatrixU<T>& dx, const auto& res) {
      if (l.split() == Split::column) {
        const MatrixU<T> dln = r(dln_);
        l.backward_bf16(exec, Bf16Matrix(in), Bf16Matrix(dout), dln, part_.tensor_sum);
        layernorm_backward(xin, w, bias, mean, rstd, dln, dx, res);
      } else {
        const MatrixU<std::uint16_t> dln16 = r(dln16_);
        l.backward_bf16(exec, Bf16Matrix(in), Bf16Matrix(dout), dln16);
        layernorm_backward(xin, w, bias, mean, rstd, dln16, dx, res);
      }
    };
    // MLP sub-block: mproj's input gradient (row-parallel: whole), through the GELU in place (and
    // fc's bias), fc's into d1 through the second LayerNorm and the residual.
    b.mproj.backward_bf16(exec, Bf16Matrix(r(a.h16)), MatrixU<const T>(dres), dh16);
    kernels::gelu_backward_saved(exec, r(a.fc), dh16, dh16, store_->grad(b.fc.bias_index()));
    column_backward(b.fc, r(a.ln2_16), dh16, r(a.x1), b.ln2_w, b.ln2_b, a.mean2, a.rstd2, d1, dres);
    // Attention sub-block.
    b.proj.backward_bf16(exec, Bf16Matrix(r(a.y16)), MatrixU<const T>(d1), dy16);
    attention_backward_bf16(exec, a.qkv16.data(), batch_scores(a.att16, batch), dy16, dqkv16,
                            batch_scores(dscores16_, batch), shape_.window);
    kernels::bias_backward(exec, dqkv16, store_->grad(b.qkv.bias_index()));
    column_backward(b.qkv, r(a.ln1_16), dqkv16, x, b.ln1_w, b.ln1_b, a.mean1, a.rstd1, dres, d1);
  } else {
    const MatrixU<T> dh = r(dh_), dln = r(dln_), dy = r(dy_), dqkv = r(dqkv_);
    // MLP sub-block (mproj is row-parallel: its input gradient needs no sum).
    linear_backward(exec, b.mproj, r(a.h), dres, dh, part_.tensor_sum);
    kernels::gelu_backward_saved(exec, r(a.fc), dh, dh, store_->grad(b.fc.bias_index()));  // and fc's bias
    linear_backward(exec, b.fc, r(a.ln2), dh, dln, part_.tensor_sum, Linear<T>::Bias::caller);
    // d1: the gradient of x1, through LayerNorm and the residual.
    layernorm_backward(r(a.x1), b.ln2_w, b.ln2_b, a.mean2, a.rstd2, dln, d1, dres);
    // Attention sub-block.
    b.proj.backward(exec, r(a.y), d1, dy);
    attend_backward(exec, a, dy, dqkv, batch);
    linear_backward(exec, b.qkv, r(a.ln1), dqkv, dln, part_.tensor_sum);
    layernorm_backward(x, b.ln1_w, b.ln1_b, a.mean1, a.rstd1, dln, dres, d1);
  }
}

template <class T>
void Gpt<T>::forward(const ExecSpace& exec, int slot) {
  ScopedRegion region("tessera::nn::Gpt::forward");
  const int batch = this->batch_of(slot);
  const int tokens = batch * seq_;
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
  const int tokens = batch * seq_;
  const std::size_t n = std::size_t(tokens), C = std::size_t(shape_.width);
  Slot& s = slots_[std::size_t(slot)];
  const MatrixU<T> dres = tokens_rows(dres_, tokens);
  if (last_stage()) {
    head_backward(exec, s, tokens);
    const MatrixU<T> dhf = tokens_rows(dhf_, tokens);
    tensor_sum(exec, dhf);
    if (hooks_) hooks_->before_backward(lnf_unit_);
    if (shape_.llama)
      kernels::rmsnorm_backward(exec, tokens_rows(s.x.back(), tokens), store_->value(lnf_w_),
                                first(s.rstdf, std::size_t(tokens)), dhf, dres, store_->grad(lnf_w_));
    else
      kernels::layernorm_backward(exec, tokens_rows(s.x.back(), tokens), store_->value(lnf_w_),
                                  first(s.meanf, std::size_t(tokens)), first(s.rstdf, std::size_t(tokens)), dhf, dres,
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
    const bool positions = wpe_ != npos;
    if (hooks_) {
      if (positions) hooks_->before_backward(wpe_unit_);
      hooks_->before_backward(wte_unit_);
    }
    kernels::embedding_backward(exec, rows(s.input, batch), MatrixU<const T>(dres), store_->grad_matrix(wte_),
                                positions ? store_->grad_matrix(wpe_) : MatrixU<T>(), vocab_first_, pos_);
    if (hooks_) {
      if (positions) hooks_->after_backward(wpe_unit_);
      hooks_->after_backward(wte_unit_);
    }
  } else {
    Kokkos::deep_copy(exec, MatrixU<T>(s.dinput.data(), n, C), dres);
  }
}

template class Gpt<float>;
template class Gpt<double>;

}  // namespace tessera::nn
