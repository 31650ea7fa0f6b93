#pragma once
// A GPT-2-style decoder-only transformer over a byte (or any) vocabulary:
//   x = wte[tokens] + wpe[positions]
//   per block:  x = x + attn.proj(attention(attn.qkv(ln_1(x))))     (causal multi-head)
//               x = x + mlp.proj(gelu(mlp.fc(ln_2(x))))               (4x wider MLP)
//   logits = ln_f(x) wte^T                                            (head tied to wte)
// Loss: mean cross-entropy of the next token over the T positions of a sample.
//
// Parameter names (logical shapes; docs/models.md maps them onto PyTorch):
//   wte.weight [V, C], wpe.weight [T, C], ln_f.weight/bias [C],
//   blocks.{i}.ln_1.weight/bias [C], blocks.{i}.attn.qkv.weight [3, C, C] and .bias [3, C]
//   (q, k, v: [3C, C] of nn.Linear reshaped), blocks.{i}.attn.proj.weight [C, C] / .bias [C],
//   blocks.{i}.ln_2.weight/bias [C], blocks.{i}.mlp.fc.weight [4C, C] / .bias [4C],
//   blocks.{i}.mlp.proj.weight [C, 4C] / .bias [C].
//
// Tensor parallelism (Megatron): each tensor rank holds heads/tp heads (qkv column-parallel,
// proj row-parallel) and 1/tp of the MLP's hidden width (fc column-, proj row-parallel):
// one sum over the tensor group per sub-block forward and one backward. The vocabulary splits
// too: rank t holds rows [t V/tp, (t+1) V/tp) of wte, the embedding sums its partial lookups
// over the group, and the loss is a vocabulary-parallel cross-entropy that exchanges per-row
// maxima, sums and target logits (3 numbers a row), never the logits.
//
// Pipeline parallelism cuts between blocks: stage 0 holds the embeddings, the last stage ln_f
// and the head. With more than one stage the last holds its own copy of wte (Tie::copy), kept
// equal to stage 0's by summing their gradients (OptimizerStep) and updating both alike.
//
// Units (what hooks and ZeRO see): wte (alone in its bucket), wpe, one per block, ln_f, and on
// a last stage that is not the first, the copy of wte.
//
// Activations: with recompute off, a slot keeps every block's intermediate tensors; with it on,
// only each block's input, and backward recomputes the block's forward into one shared set.
// Sliding-window attention (GptShape::window = W, either family): position i attends to the keys
// i - W < j <= i only (Mistral's sliding_window); the attention's products skip what no row sees.
//
// The Llama family (GptShape::llama; docs/models.md gives every formula): the same skeleton with
// RMSNorm (no biases anywhere), no position embedding but rotary embeddings of q and k
// (kernels/rope.hpp: Hugging Face's half-split rotate_half), grouped-query attention (kv_heads
// key/value heads, each shared by heads/kv_heads query heads: the attention reads them repeated,
// as Hugging Face's repeat_kv), a SwiGLU MLP of its own width (down(silu(gate x) * up x)) and a
// head tied to wte or its own lm_head.weight [V, C] (vocabulary-parallel like wte). Its names:
//   wte.weight, blocks.{i}.ln_1.weight, blocks.{i}.attn.q.weight [H hd, C], .attn.k.weight and
//   .attn.v.weight [KV hd, C], .attn.proj.weight [C, C], blocks.{i}.ln_2.weight,
//   blocks.{i}.mlp.gate.weight and .mlp.up.weight [F, C], .mlp.proj.weight [C, F], ln_f.weight,
//   lm_head.weight (untied only).
// Tensor parallelism splits the query heads and the key/value heads alike (tp divides kv_heads),
// gate and up by columns, proj and mlp.proj by rows; the unit layout and the pipeline cuts are the
// GPT's (without wpe; an untied head is a unit of its own on the last stage).
//
// Every product computes in Part::precision (train.precision, decided by whoever builds the
// model). Where the products take bf16 operands (blas::bf16_operands(Part::precision): bf16 on a
// host bf16 GEMM), the tensors only products read (ln_1's, ln_2's and ln_f's outputs, the GELU's,
// qkv) are kept in bf16 (half the bytes, no packing, the same bits), and the products read the
// weights' bf16 copies (nn/linear.hpp).
#include <array>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <span>
#include <vector>

#include "kernels/attention.hpp"
#include "kernels/positions.hpp"
#include "nn/linear.hpp"
#include "nn/network.hpp"
#include "nn/param_store.hpp"

namespace tessera::nn {

struct GptShape {
  int vocab = 256;
  int context = 128;  ///< T
  int width = 256;    ///< C
  int heads = 4;
  int layers = 4;     ///< blocks
  bool gelu_tanh = false;  ///< the MLP's GELU in GPT-2's tanh form (model.gelu_approximate)
  bool llama = false;      ///< the Llama family's block (RMSNorm, RoPE, GQA, SwiGLU, no biases)
  int kv_heads = 0;        ///< llama: key/value heads (divides heads)
  int ffn = 0;             ///< llama: the SwiGLU MLP's hidden width
  double rope_theta = 10000.0;
  double norm_eps = 1e-5;  ///< llama: RMSNorm's epsilon
  bool tied = true;        ///< the head is wte (else lm_head.weight; llama only)
  /// Sliding-window attention (model.window): each position attends to itself and the window - 1
  /// before it; 0 (or at least the context: core/config.hpp attention_window makes it 0): every
  /// earlier position.
  int window = 0;
};

/// One point-to-point transfer of a context group (Gpt::Part::messages): n elements of data to
/// (send) or from group rank `peer`.
template <class T>
struct ContextMessage {
  T* data = nullptr;
  std::size_t n = 0;
  int peer = 0;
  bool send = false;
};

template <class T>
class Gpt : public Network<T> {
 public:
  struct Part {
    int first_block = 0;
    int end_block = -1;  ///< -1: to the last block
    int tp = 1, t = 0;
    std::function<void(T*, std::size_t)> tensor_sum;  ///< sum over the tensor group (tp > 1)
    bool recompute = false;
    Precision precision = Precision::fp32;  ///< of every product (train.precision; float models)
    /// Context parallelism (parallel.spatial): sp ranks share each sequence, this one holding
    /// positions [s T/sp, (s+1) T/sp) of every activation; the attention regroups them by heads
    /// (all_to_all over the group: per_rank elements to and from each rank, rank order) and the
    /// loss sums are summed over the group (spatial_sum).
    int sp = 1, s = 0;
    std::function<void(const T*, T*, std::size_t)> all_to_all;
    std::function<void(double*, std::size_t)> spatial_sum;
    /// parallel.context_comm = "ring" (nn/context_ring.cpp): keys and values pass around the
    /// group by point-to-point instead of the all-to-all; messages() starts nonblocking sends and
    /// receives to and from ranks of the group, wait() completes every one started.
    bool ring = false;
    /// Under the ring without a window: this rank holds chunks s and 2 sp - 1 - s of 2 sp of
    /// every sequence (causal load balancing; the deck's context_head_tail decides), else one block.
    bool head_tail = false;
    std::function<void(std::span<const ContextMessage<T>>)> messages;
    std::function<void()> wait;
  };

  /// \brief Registers the part's parameters in `store` (before store.plan()).
  Gpt(ParamStore<T>& store, const GptShape& shape, Part part = {});

  const GptShape& shape() const { return shape_; }
  bool first_stage() const override { return first_ == 0; }
  bool last_stage() const override { return end_ == shape_.layers; }
  /// First stage: T token ids (as floats) per sample; else T*C activations.
  int input_width() const override;
  /// Last stage: T * V/tp logits per sample; else T*C activations.
  int output_width() const override;
  int label_width() const override { return seq_; }
  /// \brief Bytes add_slot() allocates: `slots` slots of `max_batch` rows each plus the working
  /// set the first slot makes for all (backward's buffers, the recomputed block, the loss's sums);
  /// slots = 0: the working set alone. Counts every buffer add_slot() and make_acts() make.
  double activation_bytes(int max_batch, int slots) const override;

  MatrixU<T> input(int slot) const override;
  MatrixU<T> output(int slot) const override;
  MatrixU<T> grad_output(int slot) const override;
  MatrixU<T> grad_input(int slot) const override;

  void forward(const ExecSpace& exec, int slot) override;
  void backward(const ExecSpace& exec, int slot) override;

  /// \brief Vocabulary-parallel cross-entropy of the next token: labels (B*T), loss per sample
  /// the mean over its T positions, accuracy likewise (argmax = target); dlogits = scale/T *
  /// (softmax - onehot). Collective over the tensor group.
  LossSums loss(const ExecSpace& exec, int slot, VectorU<const std::int32_t> labels,
                MatrixU<const T> targets, T scale) override;

  /// \brief Forward of the slot's first `positions` tokens only (generation: B rows of T token
  /// ids, of which the first `positions` are read) and the logits of position positions-1 of
  /// every row into out (B, V/tp). Needs the whole model on this rank's stage (pp = 1).
  void next_token_logits(const ExecSpace& exec, int slot, int positions, const MatrixU<T>& out);

 protected:
  void add_slot() override;
  void clear_slots() override;

 private:
  // One block's saved tensors ((B*T) rows each, B = max batch): the input of each sub-layer
  // and what backward needs. fc holds mlp.fc's output until the GELU replaces it with gelu'.
  // att: the attention probabilities (B, heads, T, T), or where the fused attention runs (a GPU
  // build, nn/attention.hpp) each row's log-sum-exp (B, heads, T, 1).
  // ln1, ln2, h, qkv, y and att are left empty where their bf16 versions (ln1_16, ln2_16, h16,
  // qkv16 as nn::qkv_to_bf16's head blocks, y16, att16) hold them.
  struct Acts {
    Matrix<T> ln1, qkv, y, x1, ln2, fc, h;
    Matrix<std::uint16_t> ln1_16, ln2_16, h16, qkv16, y16;
    Matrix<std::uint16_t> fc16;  // llama under bf16 activations: gate and up (the products' bf16 outputs)
    Vector<T> mean1, rstd1, mean2, rstd2;
    Kokkos::View<T****, Kokkos::LayoutRight, MemSpace> att;
    Kokkos::View<std::uint16_t****, Kokkos::LayoutRight, MemSpace> att16;
  };
  struct Block {
    std::size_t unit = 0;
    std::size_t ln1_w = 0, ln1_b = 0, ln2_w = 0, ln2_b = 0;
    Linear<T> qkv, proj, fc, mproj;  // llama: qkv is q, fc is gate
    std::optional<Linear<T>> k, v, up;  // llama only
  };
  struct Slot {
    Matrix<T> input;           // (B, input_width)
    std::vector<Matrix<T>> x;  // blocks+1 of (B*T, C): x[0] the stage's input activations
    std::vector<Acts> acts;    // per block, without recompute
    Matrix<T> hf, logits, dlogits, doutput, dinput;
    // hf, the logits and their gradient in bf16, where their fp32 buffers are left empty.
    Matrix<std::uint16_t> hf16, logits16, dlogits16;
    Vector<T> meanf, rstdf;
  };
  using Network<T>::rows;
  using Network<T>::hooks_;

  Acts make_acts(const char* what) const;
  /// A (max batch, heads on this rank, T, attention_scores_width(T)) buffer of E, counted as
  /// activation memory under `what`.
  template <class E>
  Kokkos::View<E****, Kokkos::LayoutRight, MemSpace> scores(const std::string& what) const;
  MatrixU<T> tokens_rows(const Matrix<T>& m, int tokens) const;
  void block_forward(const ExecSpace& exec, const Block& b, const MatrixU<const T>& x,
                     const Acts& a, int tokens, const MatrixU<T>& out) const;
  void block_backward(const ExecSpace& exec, const Block& b, const MatrixU<const T>& x,
                      const Acts& a, int tokens, const MatrixU<T>& dres) const;
  // The same with the products' inputs of element type A: T, or std::uint16_t (bf16).
  template <class A>
  void block_forward_as(const ExecSpace& exec, const Block& b, const MatrixU<const T>& x,
                        const Acts& a, int tokens, const MatrixU<T>& out) const;
  template <class A>
  void block_backward_as(const ExecSpace& exec, const Block& b, const MatrixU<const T>& x,
                         const Acts& a, int tokens, const MatrixU<T>& dres) const;
  /// Under bf16 activations, out = res + b + in W^T of a layer on the residual stream (proj,
  /// mproj): the product stored in bf16 in scratch, or, row-parallel, in fp32 in out to be summed
  /// over the tensor group.
  void residual_forward_bf16(const ExecSpace& exec, const Linear<T>& l, const Bf16Matrix& in,
                             const MatrixU<const T>& res, const MatrixU<T>& out,
                             const MatrixU<std::uint16_t>& scratch) const;
  // The Llama family's block (nn/llama_block.cpp), as block_forward_as/block_backward_as.
  template <class A>
  void llama_forward_as(const ExecSpace& exec, const Block& b, const MatrixU<const T>& x, const Acts& a, int tokens,
                        const MatrixU<T>& out) const;
  template <class A>
  void llama_backward_as(const ExecSpace& exec, const Block& b, const MatrixU<const T>& x, const Acts& a, int tokens,
                         const MatrixU<T>& dres) const;
  /// The q, k and v blocks (or the MLP's gate and up) of a llama buffer of `tokens` rows: consecutive
  /// row-major matrices of the given widths.
  template <class E>
  static std::array<MatrixU<E>, 3> parts(E* base, int tokens, std::array<int, 3> widths);
  void head_backward(const ExecSpace& exec, const Slot& s, int tokens) const;
  /// The head's weight as the products read it: its bf16 copy or its values (float models).
  blas::Operand head_weight_operand(const ExecSpace& exec) const;
  /// True where the slots hold bf16 activations; throws where the products no longer take them
  /// (the host's bf16 GEMM changed after the slots were made).
  bool bf16_acts() const;
  /// What add_slot() decides with the first slot: bf16 activations where the products take bf16
  /// operands, except under context parallelism.
  bool keeps_bf16_activations() const;
  /// The fp32 logits or their gradient of a slot (output(), grad_output() on the last stage);
  /// std::logic_error where they are kept in bf16.
  const Matrix<T>& fp32_logits(const Matrix<T>& m) const;
  void tensor_sum(const ExecSpace& exec, const MatrixU<T>& m) const;
  void embed(const ExecSpace& exec, const MatrixU<const T>& tokens, const MatrixU<T>& x) const;
  void head_forward(const ExecSpace& exec, const MatrixU<const T>& x, const Slot& s, int tokens) const;
  std::size_t head_unit() const { return head_own_unit() != npos ? head_own_unit() : wte_unit_; }
  std::size_t head_weight() const { return lm_head_ != npos ? lm_head_ : wte_copy_ != npos ? wte_copy_ : wte_; }
  /// The unit of the head alone (an untied head, or the last stage's copy of wte), npos where the
  /// head is wte on the embedding's stage.
  std::size_t head_own_unit() const { return lm_head_unit_ != npos ? lm_head_unit_ : wte_copy_unit_; }
  /// This rank's widths: the MLP's hidden width (h), what its first products write (fc: gate and
  /// up for llama), the compact q, k, v of a llama.
  std::size_t mlp_local() const;
  std::size_t fc_local() const;
  std::size_t qkv_compact() const { return std::size_t(heads_local_ + 2 * kv_local_) * std::size_t(hd_); }
  /// The attention of `batch` samples on the rank's positions: qkv (tokens, 3 C/tp) in, y
  /// (tokens, C/tp) out, att and its scores as the block's. Under context parallelism, regrouped
  /// by heads around the attention (nn/context_parallel.cpp): a.qkv then holds the gathered
  /// operands that backward reads, `qkv` is working memory.
  void attend(const ExecSpace& exec, const MatrixU<const T>& qkv, const MatrixU<T>& y, const Acts& a, int batch) const;
  /// Its backward: dqkv (tokens, 3 C/tp) from dy (tokens, C/tp).
  void attend_backward(const ExecSpace& exec, const Acts& a, const MatrixU<const T>& dy, const MatrixU<T>& dqkv,
                       int batch) const;
  /// The positions' operands regrouped between sequence blocks and heads: `parts` column groups of
  /// heads_local_ heads (q, k, v: 3; y: 1). to_heads: local (tokens, parts C/tp) -> gathered
  /// (batch T, parts C/(tp sp)); else back.
  void regroup(const ExecSpace& exec, const T* from, T* to, int batch, int parts, bool to_heads) const;
  /// True where the attention regroups by heads (context parallelism by the all-to-all): the
  /// projections' q, k, v go to cp_qkv_ and a.qkv holds the gathered operands.
  bool regrouped() const { return part_.sp > 1 && !ring_; }
  /// Key/value heads of this rank's attention: the llama's kv_heads / tp, the GPT's heads / tp.
  int ring_kv_heads() const { return shape_.llama ? kv_local_ : heads_local_; }
  /// Rows of ring_kv_ and ring_dkv_: the ring's two blocks, or the own block, the halo received
  /// and the tails staged for the following ranks.
  std::size_t ring_kv_rows(int batch) const {
    return std::size_t(batch) * std::size_t(part_.head_tail ? 2 * seq_ : seq_ + 2 * halo_positions());
  }
  /// Rows of ring_dkv_: the ring's step contribution, the sum coming in and the sum going on, or
  /// as ring_kv_ for the halo.
  std::size_t ring_dkv_rows(int batch) const {
    return part_.head_tail ? std::size_t(batch) * std::size_t(3 * seq_) : ring_kv_rows(batch);
  }
  /// The ring's attention (nn/context_ring.cpp), as attend and attend_backward.
  void ring_attend(const ExecSpace& exec, const MatrixU<const T>& qkv, const MatrixU<T>& y, const Acts& a,
                   int batch) const;
  void ring_attend_backward(const ExecSpace& exec, const Acts& a, const MatrixU<const T>& dy,
                            const MatrixU<T>& dqkv, int batch) const;
  /// Under the ring with a window: positions of the halo from rank s - d (d >= 1; 0 past the
  /// window or the first rank), and their sum over d (the same on every rank).
  int halo_from(int d) const;
  int halo_positions() const;
  /// Starts the halo's messages (wait() completes them): the keys and values of the preceding
  /// ranks' tails in, this rank's tail out; gradients: the halo's gradients out to their owners,
  /// those of this rank's tail in.
  void halo_exchange(const ExecSpace& exec, int batch, bool gradients) const;
  /// f(pass, keys and values, their gradients) for each piece of the halo this rank reads.
  template <class F>
  void halo_passes(int batch, F&& f) const;
  /// (rows, width) of the attention's score buffers: att and dscores.
  std::array<std::size_t, 2> scores_extents() const;
  /// The final norm (LayerNorm, or llama's RMSNorm) of x into the slot's hf/hf16.
  void final_norm(const ExecSpace& exec, const MatrixU<const T>& x, const Slot& s, int tokens) const;

  static constexpr std::size_t npos = static_cast<std::size_t>(-1);
  GptShape shape_;
  Part part_;
  int first_ = 0, end_ = 0;
  int heads_local_ = 0, vocab_local_ = 0, vocab_first_ = 0;
  int kv_local_ = 0, ffn_local_ = 0, hd_ = 0;  // llama: key/value heads, MLP width on this rank; head width
  int seq_ = 0, att_heads_ = 0;  // positions on this rank; heads its attention runs
  kernels::Positions pos_;       // where the rank's positions sit in the sequence
  bool ring_ = false;            // context parallelism by the ring (nn/context_ring.cpp)
  Vector<T> rope_cos_, rope_sin_;              // llama: kernels::rope_tables
  ParamStore<T>* store_;
  std::vector<Block> blocks_;
  std::size_t wte_ = npos, wpe_ = npos, wte_copy_ = npos, lnf_w_ = npos, lnf_b_ = npos;
  std::size_t wte_unit_ = npos, wpe_unit_ = npos, lnf_unit_ = npos, wte_copy_unit_ = npos;
  std::size_t lm_head_ = npos, lm_head_unit_ = npos;  // an untied head (llama)
  std::vector<Slot> slots_;
  bool bf16_acts_ = false;  // decided with the first slot: blas::bf16_operands(part_.precision) then
  // Shared by every slot: backward's working buffers and, with recompute, one block's tensors.
  Acts work_;
  Matrix<T> dres_, dln_, d1_, dqkv_, dy_, dh_, dhf_;
  // Under bf16 activations, what only products (and the bf16 attention) read: fc's output
  // gradient, the attention's output gradient, qkv's gradient, the scores' gradient (in place of
  // dscores_), and the LayerNorms' output gradients (dln_ where a tensor group sums them).
  // Forward stores its products' outputs in the first three. dln_ is fp32; dh_, dy_ and dqkv_
  // are not made.
  Matrix<std::uint16_t> dh16_, dy16_, dqkv16_, dln16_;
  Kokkos::View<T****, Kokkos::LayoutRight, MemSpace> dscores_;
  Kokkos::View<std::uint16_t****, Kokkos::LayoutRight, MemSpace> dscores16_;
  Vector<T> xent_;  // loss: per-row (max, sum) of every tensor rank, then the target logits
  // llama: the compact q, k, v (forward: the products' outputs; backward: their gradients) and
  // the gradients of gate and up; in bf16 under bf16 activations.
  Matrix<T> qkvc_, dgu_;
  Matrix<std::uint16_t> qkvc16_, dgu16_;
  // Context parallelism: the local operands before regrouping (and the gathered dqkv), the
  // gathered y (and dy), and the all-to-all's send and receive buffers.
  Matrix<T> cp_qkv_, cp_y_, cp_send_, cp_recv_;
  // The ring (nn/context_ring.cpp): two buffers (B T/sp rows each) of keys and values (the
  // key/value heads only), one in use while the other is in flight, and three of their gradients;
  // the scores of one step's blocks and their gradients (heads x B T/sp rows of T/sp).
  Matrix<T> ring_kv_, ring_dkv_, ring_s_, ring_ds_;
};

extern template class Gpt<float>;
extern template class Gpt<double>;

}  // namespace tessera::nn
