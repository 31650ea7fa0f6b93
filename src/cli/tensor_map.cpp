#include "cli/tensor_map.hpp"

#include <fmt/format.h>

#include <cmath>
#include <stdexcept>
#include <nlohmann/json.hpp>

#include "core/deck.hpp"
#include "core/error.hpp"
#include "core/version.hpp"
#include "kernels/layernorm.hpp"
#include "train/field_norm.hpp"

namespace tessera::cli {

namespace {

using Shape = std::vector<std::uint64_t>;

bool contains(const std::string& s, const char* part) { return s.find(part) != std::string::npos; }

// Replaces the first `from` in s by `to`; true where there was one.
bool replace(std::string& s, const std::string& from, const std::string& to) {
  const std::size_t at = s.find(from);
  if (at == std::string::npos) return false;
  s.replace(at, from.size(), to);
  return true;
}

// The [rows, cols] matrix of a tensor whose columns are its last dimension.
std::pair<std::uint64_t, std::uint64_t> as_matrix(const Shape& shape) {
  std::uint64_t rows = 1;
  for (std::size_t d = 0; d + 1 < shape.size(); ++d) rows *= shape[d];
  return {rows, shape.empty() ? 1 : shape.back()};
}

std::vector<float> transpose(const std::vector<float>& v, std::uint64_t rows, std::uint64_t cols) {
  std::vector<float> out(v.size());
  for (std::uint64_t r = 0; r < rows; ++r)
    for (std::uint64_t c = 0; c < cols; ++c) out[c * rows + r] = v[r * cols + c];
  return out;
}

// The fused q/k/v ([3, C, C] and [3, C]) as nn.Linear's [3C, C] and [3C].
Shape torch_shape(const std::string& name, const Shape& shape) {
  if (!contains(name, ".attn.qkv.") || shape.size() < 2) return shape;
  Shape s{shape[0] * shape[1]};
  s.insert(s.end(), shape.begin() + 2, shape.end());
  return s;
}

TensorMapping hf_gpt2(const nn::ParamInfo& p) {
  TensorMapping m;
  m.name = p.name;
  m.shape = Shape(p.logical_shape.begin(), p.logical_shape.end());
  m.exported = p.name;
  if (!replace(m.exported, "blocks.", "transformer.h.")) m.exported = "transformer." + p.name;
  // Conv1D layers, stored [in, out]: the four projections' weights are transposed.
  const bool projection = replace(m.exported, ".attn.qkv.", ".attn.c_attn.") ||
                          replace(m.exported, ".attn.proj.", ".attn.c_proj.") ||
                          replace(m.exported, ".mlp.fc.", ".mlp.c_fc.") ||
                          replace(m.exported, ".mlp.proj.", ".mlp.c_proj.");
  m.exported_shape = torch_shape(p.name, m.shape);
  if (projection && m.exported_shape.size() == 2) {
    m.transposed = true;
    m.exported_shape = {m.exported_shape[1], m.exported_shape[0]};
  }
  return m;
}

// LlamaForCausalLM's names (nn.Linear throughout, so renamed only): the decoder under `model.`,
// the untied head beside it.
TensorMapping hf_llama(const nn::ParamInfo& p) {
  TensorMapping m;
  m.name = p.name;
  m.shape = m.exported_shape = Shape(p.logical_shape.begin(), p.logical_shape.end());
  static const std::vector<std::pair<std::string, std::string>> parts = {
      {".ln_1.", ".input_layernorm."},     {".attn.q.", ".self_attn.q_proj."},
      {".attn.k.", ".self_attn.k_proj."},  {".attn.v.", ".self_attn.v_proj."},
      {".attn.proj.", ".self_attn.o_proj."}, {".ln_2.", ".post_attention_layernorm."},
      {".mlp.gate.", ".mlp.gate_proj."},   {".mlp.up.", ".mlp.up_proj."},
      {".mlp.proj.", ".mlp.down_proj."}};
  if (p.name == "wte.weight") {
    m.exported = "model.embed_tokens.weight";
  } else if (p.name == "ln_f.weight") {
    m.exported = "model.norm.weight";
  } else if (p.name == "lm_head.weight") {
    m.exported = p.name;
  } else {
    m.exported = p.name;
    bool renamed = false;
    if (replace(m.exported, "blocks.", "model.layers."))
      for (const auto& [from, to] : parts)
        if (replace(m.exported, from, to)) {
          renamed = true;
          break;
        }
    if (!renamed) throw std::logic_error("hf_llama: no Hugging Face name for the llama's parameter " + p.name);
  }
  return m;
}

// The U-Net as bench/unet_torch.py's UNet builds it (its state_dict's names), and its
// normalisation (the rule, and the statistics where the checkpoint stores them).
void unet_json(nlohmann::ordered_json& j, const Config& cfg, const ModelShape& shape) {
  const auto& m = cfg.model;
  const std::int64_t pools = std::int64_t{1} << (m.channels.size() - 1);
  j["in_channels"] = shape.sample_shape.at(0);
  j["out_channels"] = shape.target_shape.at(0);
  j["levels"] = m.channels;
  j["kernel"] = m.kernel;
  j["padding"] = m.kernel / 2;
  j["activation"] = to_string(m.activation);
  if (m.activation == Activation::gelu) j["gelu_approximate"] = "none";
  j["down"] = "level l: act(conv2(act(conv1(x)))) (k x k, stride 1, zero padding k/2), kept as skip l; then "
              "max_pool2d(2) to level l+1 (not after the last level)";
  j["up"] = "level l = L-2 .. 0: u = upconv(x) (ConvTranspose2d(levels[l+1], levels[l], 2, stride=2)); "
            "x = act(conv2(act(conv1(torch.cat([u, skip l], dim=1)))))";
  j["skip_order"] = "up-sampled channels first, then the encoder's (torch.cat([u, skip], dim=1))";
  j["head"] = "Conv2d(levels[0], out_channels, 1)";
  j["fields"] = fmt::format("[N, in_channels, H, W] -> [N, out_channels, H, W], H and W multiples of {}", pools);
  j["loss"] = "mean over the samples of the mean squared error over every value of the (standardised) fields";
  j["metric"] = "relative L2 error ||prediction - target|| / ||target|| per sample, in the targets' units, averaged";
  nlohmann::ordered_json norm;
  if (!shape.norm.empty()) {
    norm["rule"] = kFieldNormRule;
    const FieldNormValues values = field_norm_values(shape.norm);
    for (std::size_t i = 0; i < values.size(); ++i) {
      const std::string name = kFieldNormTensors[i];
      norm[name.substr(name.find('/') + 1)] = values[i];
    }
  } else if (normalizes_fields(cfg)) {
    norm["rule"] = kFieldNormRule;
    norm["statistics"] = "not in the checkpoint (written before checkpoints stored them): the per-channel mean and "
                         "population std of the deck's training split (docs/data.md), as float32";
  }
  j["normalization"] = norm.empty() ? nlohmann::ordered_json() : norm;
}

}  // namespace

const char* to_string(Naming naming) {
  switch (naming) {
    case Naming::hf_gpt2: return "hf-gpt2";
    case Naming::hf_llama: return "hf-llama";
    case Naming::torch: break;
  }
  return "torch";
}

std::vector<TensorMapping> tensor_map(const Config& cfg, const std::vector<nn::ParamInfo>& params,
                                      Naming naming) {
  const ModelKind kind = cfg.model.kind;
  const char* article = kind == ModelKind::mlp ? "an" : "a";
  if (naming == Naming::hf_gpt2 && kind != ModelKind::gpt)
    throw InputError(fmt::format("--hf-gpt2: the model is {} {}; only a gpt maps onto Hugging Face's "
                                 "GPT2LMHeadModel (export it {})", article, to_string(kind),
                                 kind == ModelKind::llama ? "with --hf-llama" : "without --hf-gpt2"));
  if (naming == Naming::hf_llama && kind != ModelKind::llama)
    throw InputError(fmt::format("--hf-llama: the model is {} {}; only a llama maps onto Hugging Face's "
                                 "LlamaForCausalLM (export it {})", article, to_string(kind),
                                 kind == ModelKind::gpt ? "with --hf-gpt2" : "without --hf-llama"));
  std::vector<TensorMapping> out;
  for (const nn::ParamInfo& p : params) {
    if (naming == Naming::hf_gpt2) {
      out.push_back(hf_gpt2(p));
      continue;
    }
    if (naming == Naming::hf_llama) {
      out.push_back(hf_llama(p));
      continue;
    }
    TensorMapping m;
    m.name = m.exported = p.name;
    m.shape = Shape(p.logical_shape.begin(), p.logical_shape.end());
    m.exported_shape = torch_shape(p.name, m.shape);
    out.push_back(std::move(m));
  }
  return out;
}

std::vector<float> to_exported(const TensorMapping& m, std::vector<float> values) {
  if (!m.transposed) return values;
  const auto [rows, cols] = as_matrix(m.shape);
  return transpose(values, rows, cols);
}

std::vector<float> from_exported(const TensorMapping& m, std::vector<float> values) {
  if (!m.transposed) return values;
  const auto [rows, cols] = as_matrix(m.shape);
  return transpose(values, cols, rows);
}

std::string model_json(const Config& cfg, const ModelShape& shape, const std::vector<TensorMapping>& map,
                       Naming naming, const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json j;
  j["format"] = "tessera-export";
  j["tessera_version"] = TESSERA_VERSION;
  j["kind"] = to_string(cfg.model.kind);
  j["names"] = to_string(naming);
  const auto& m = cfg.model;
  if (m.kind == ModelKind::llama) {
    const int hd = m.width / m.heads;
    j["layers"] = m.layers;
    j["heads"] = m.heads;
    j["kv_heads"] = m.kv_heads_or_heads();
    j["head_dim"] = hd;
    j["width"] = m.width;
    j["ffn_width"] = m.ffn_width_or_default();
    j["context"] = m.context;
    j["vocab_size"] = shape.outputs;
    j["block"] = "x = x + attn.proj(attention(ln_1(x))); x = x + mlp.proj(silu(mlp.gate(h)) * mlp.up(h)), "
                 "h = ln_2(x); no biases anywhere";
    j["norm"] = "RMSNorm: x * rsqrt(mean(x^2 over the C channels) + norm_eps) * weight (ln_1, ln_2, ln_f)";
    j["norm_eps"] = m.norm_eps;
    j["rope"] = "q and k of each head (hd channels) after the projections: x * cos + rotate_half(x) * sin, "
                "rotate_half(x) = cat(-x[hd/2:], x[:hd/2]); angle of position p, channel i: p * "
                "rope_theta^(-2 (i mod hd/2) / hd) (Hugging Face's half-split form, not interleaved pairs)";
    j["rope_theta"] = m.rope_theta;
    j["attention"] = "causal; query head h reads key/value head h / (heads / kv_heads) (repeat_kv); scores "
                     "scaled by attention_scale";
    j["window"] = attention_window(m);
    j["window_rule"] = "0: every earlier position; W > 0: query i sees keys i - W < j <= i only (sliding window)";
    j["attention_scale"] = 1.0 / std::sqrt(static_cast<double>(hd));
    j["activation"] = "silu";
    j["positions"] = "0 .. context-1 in every window; no position embedding";
    j["tied_head"] = m.tie_embeddings ? "logits = ln_f(x) @ wte.weight^T (no separate head tensor)"
                                      : "no: logits = ln_f(x) @ lm_head.weight^T";
    j["sample"] = "a window of context tokens; loss = mean over its positions of the next token's cross-entropy";
  } else if (m.kind == ModelKind::gpt) {
    j["layers"] = m.layers;
    j["heads"] = m.heads;
    j["width"] = m.width;
    j["context"] = m.context;
    j["vocab_size"] = shape.outputs;
    j["mlp_hidden"] = 4 * m.width;
    j["activation"] = "gelu";
    // PyTorch's nn.GELU(approximate=...): "none" the exact erf form, "tanh" GPT-2's.
    j["gelu_approximate"] = to_string(m.gelu_approximate);
    j["layer_norm_eps"] = kernels::layernorm_eps;
    j["attention_scale"] = 1.0 / std::sqrt(static_cast<double>(m.width / m.heads));
    j["window"] = attention_window(m);
    j["window_rule"] = "0: every earlier position; W > 0: query i sees keys i - W < j <= i only (sliding window)";
    j["qkv"] = "attn.qkv.weight [3C, C] = the q, k, v projections' rows stacked; bias [3C] likewise";
    j["tied_head"] = "logits = ln_f(x) @ wte.weight^T (no separate head tensor)";
    j["sample"] = "a window of context tokens; loss = mean over its positions of the next token's cross-entropy";
  } else if (m.kind == ModelKind::unet) {
    unet_json(j, cfg, shape);
  } else {
    const bool cnn = m.kind == ModelKind::cnn;
    if (cnn) {
      j["in_channels"] = shape.sample_shape.size() == 3 ? shape.sample_shape[0] : 1;
      j["channels"] = m.channels;
      j["kernel"] = m.kernel;
      j["padding"] = m.kernel / 2;
      j["block"] = "conv (stride 1, zero padding kernel/2) -> ReLU -> 2x2 max-pool (stride 2, floor)";
      j["flatten"] = "C, H, W (torch.flatten(x, 1) of an NCHW tensor)";
    } else {
      j["in_features"] = shape.in_features;
    }
    j["hidden"] = m.hidden;
    j["outputs"] = shape.outputs;
    j["activation"] = cnn ? std::string("relu") : std::string(to_string(m.activation));
    if (!cnn && m.activation == Activation::gelu) j["gelu_approximate"] = "none";
    j["loss"] = to_string(m.loss);
  }
  nlohmann::ordered_json tensors;
  for (const TensorMapping& t : map) tensors[t.exported] = t.exported_shape;
  j["tensors"] = tensors;
  for (const auto& [key, value] : metadata)
    if (key != "format" && key != "tessera.deck") j["metadata"][key] = value;
  j["deck"] = cfg.resolved_toml;
  return j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
}

std::string hf_gpt2_config(const Config& cfg, std::int64_t vocab) {
  const auto& m = cfg.model;
  nlohmann::ordered_json j;
  j["architectures"] = {"GPT2LMHeadModel"};
  j["model_type"] = "gpt2";
  j["vocab_size"] = vocab;
  j["n_positions"] = m.context;
  j["n_ctx"] = m.context;
  j["n_embd"] = m.width;
  j["n_layer"] = m.layers;
  j["n_head"] = m.heads;
  j["n_inner"] = nullptr;  // 4 n_embd
  // The exact erf GELU is transformers' "gelu"; GPT-2's own tanh form its "gelu_new".
  j["activation_function"] = m.gelu_approximate == GeluApproximate::tanh ? "gelu_new" : "gelu";
  j["layer_norm_epsilon"] = kernels::layernorm_eps;
  j["resid_pdrop"] = 0.0;
  j["embd_pdrop"] = 0.0;
  j["attn_pdrop"] = 0.0;
  j["scale_attn_weights"] = true;
  j["scale_attn_by_inverse_layer_idx"] = false;
  j["reorder_and_upcast_attn"] = false;
  j["tie_word_embeddings"] = true;
  j["bos_token_id"] = nullptr;
  j["eos_token_id"] = nullptr;
  j["torch_dtype"] = "float32";
  return j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
}

std::string hf_llama_config(const Config& cfg, std::int64_t vocab) {
  const auto& m = cfg.model;
  // With a sliding window: MistralForCausalLM, a llama whose attention has one (the same tensors
  // and names; no attention_bias, mlp_bias or pretraining_tp keys).
  const int window = attention_window(m);
  nlohmann::json j;  // keys sorted, as save_pretrained writes them
  j["architectures"] = {window > 0 ? "MistralForCausalLM" : "LlamaForCausalLM"};
  j["model_type"] = window > 0 ? "mistral" : "llama";
  if (window > 0) j["sliding_window"] = window;
  j["vocab_size"] = vocab;
  j["hidden_size"] = m.width;
  j["intermediate_size"] = m.ffn_width_or_default();
  j["num_hidden_layers"] = m.layers;
  j["num_attention_heads"] = m.heads;
  j["num_key_value_heads"] = m.kv_heads_or_heads();
  j["head_dim"] = m.width / m.heads;
  j["max_position_embeddings"] = m.context;
  j["hidden_act"] = "silu";
  j["rms_norm_eps"] = m.norm_eps;
  j["rope_theta"] = m.rope_theta;
  j["rope_scaling"] = nullptr;  // the plain rotary embedding
  j["tie_word_embeddings"] = m.tie_embeddings;
  if (window == 0) {
    j["attention_bias"] = false;
    j["mlp_bias"] = false;
    j["pretraining_tp"] = 1;
  }
  j["attention_dropout"] = 0.0;
  j["initializer_range"] = 0.02;
  j["use_cache"] = true;
  // Tessera's data carry no start or end token (byte tokens are the bytes; a BPE's ids are the
  // text's), and generate stops at a count, not at a token: none to name.
  j["bos_token_id"] = nullptr;
  j["eos_token_id"] = nullptr;
  j["pad_token_id"] = nullptr;
  j["torch_dtype"] = "float32";
  return j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
}

}  // namespace tessera::cli
