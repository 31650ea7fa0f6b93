#pragma once
// A model's tensors outside Tessera (`tessera export`, `tessera import`): PyTorch modules with
// Tessera's own names (docs/models.md; only the GPT's fused q/k/v changes shape, [3, C, C] to
// nn.Linear's [3C, C]), Hugging Face's GPT2LMHeadModel (`transformer.h.{i}...`, its Conv1D
// weights stored [in, out], so transposed) or Hugging Face's LlamaForCausalLM
// (`model.layers.{i}...`, renamed only). Also the JSON files that describe the model to whoever
// rebuilds it.
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/config.hpp"
#include "nn/param_store.hpp"
#include "train/model.hpp"

namespace tessera::cli {

enum class Naming { torch, hf_gpt2, hf_llama };

/// "torch", "hf-gpt2", "hf-llama": what export's JSON and metadata call a naming.
const char* to_string(Naming naming);

/// How one parameter looks outside.
struct TensorMapping {
  std::string name;                           ///< Tessera's: the checkpoint's /model/<name>
  std::vector<std::uint64_t> shape;           ///< its logical shape
  std::string exported;                       ///< the name outside
  std::vector<std::uint64_t> exported_shape;  ///< the shape outside
  bool transposed = false;  ///< stored transposed outside: [cols, rows] of the [rows, cols] matrix
                            ///< whose columns are the last dimension
};

/// \brief The mapping of every parameter of `params` (logical_params of the deck's model), in
/// their order. InputError where the model kind has no such naming (hf_gpt2 for a non-gpt,
/// hf_llama for a non-llama).
std::vector<TensorMapping> tensor_map(const Config& cfg, const std::vector<nn::ParamInfo>& params,
                                      Naming naming);

/// \brief Values in Tessera's layout (row-major in `shape`) to the outside layout, and back.
std::vector<float> to_exported(const TensorMapping& m, std::vector<float> values);
std::vector<float> from_exported(const TensorMapping& m, std::vector<float> values);

/// \brief Everything needed to rebuild the model elsewhere, as JSON (docs/models.md "Export"):
/// kind, widths, heads, context, vocabulary, activation (exact erf GELU), LayerNorm eps,
/// attention scale, the CNN's flatten order, the llama's RMSNorm, rotary embeddings, key/value
/// heads and SwiGLU, the parameter names and shapes outside, and
/// `metadata` (the checkpoint, its step, where training stood).
std::string model_json(const Config& cfg, const ModelShape& shape, const std::vector<TensorMapping>& map,
                       Naming naming, const std::map<std::string, std::string>& metadata);

/// \brief Hugging Face's config.json for a gpt: GPT2LMHeadModel with n_embd = width, n_head,
/// n_layer, n_positions = context, vocab_size, the GELU ("gelu" exact, "gelu_new" tanh), eps 1e-5, no dropout.
std::string hf_gpt2_config(const Config& cfg, std::int64_t vocab);

/// \brief Hugging Face's config.json for a llama, as LlamaForCausalLM's save_pretrained writes it
/// (keys sorted): hidden_size = width, intermediate_size, num_hidden_layers, num_attention_heads,
/// num_key_value_heads, head_dim, max_position_embeddings = context, vocab_size, rms_norm_eps,
/// rope_theta (rope_scaling null), tie_word_embeddings, "silu", no biases, no dropout, no BOS/EOS.
std::string hf_llama_config(const Config& cfg, std::int64_t vocab);

}  // namespace tessera::cli
