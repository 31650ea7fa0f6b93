#include "train/model.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>

#include "core/deck.hpp"
#include "core/error.hpp"
#include "nn/gpt.hpp"
#include "nn/mlp.hpp"
#include "train/field_norm.hpp"

namespace tessera {

std::vector<int> stage_bounds(const Config& cfg, const ModelShape& shape) {
  // Each pipeline-cuttable layer's multiply-adds per sample: linear layers for an MLP, blocks
  // for a GPT (the embedding's cost is a lookup; the head's is added to the last block).
  std::vector<double> cost;
  if (is_transformer(cfg.model.kind)) {
    const double C = cfg.model.width, T = cfg.model.context;
    for (int i = 0; i < cfg.model.layers; ++i) cost.push_back(T * (block_weights(cfg) + T * C));
    cost.back() += T * C * static_cast<double>(shape.outputs);
  } else {
    std::vector<std::int64_t> widths{shape.in_features};
    widths.insert(widths.end(), cfg.model.hidden.begin(), cfg.model.hidden.end());
    widths.push_back(shape.outputs);
    for (std::size_t i = 0; i + 1 < widths.size(); ++i)
      cost.push_back(static_cast<double>(widths[i] * widths[i + 1]));
  }
  const int layers = static_cast<int>(cost.size()), stages = cfg.parallel.pipeline * cfg.parallel.virtual_stages;
  std::vector<int> bounds{0};
  if (!cfg.parallel.stages.empty()) {
    for (int n : cfg.parallel.stages) bounds.push_back(bounds.back() + n);
    return bounds;
  }
  // Contiguous chunks minimising the costliest one (multiply-adds per sample): a small DP.
  std::vector<double> prefix{0.0};
  for (int i = 0; i < layers; ++i) prefix.push_back(prefix.back() + cost[static_cast<std::size_t>(i)]);
  const double inf = std::numeric_limits<double>::infinity();
  // best[s][i]: the smallest possible costliest stage splitting layers [0, i) into s stages.
  std::vector<std::vector<double>> best(stages + 1, std::vector<double>(layers + 1, inf));
  std::vector<std::vector<int>> cut(stages + 1, std::vector<int>(layers + 1, 0));
  best[0][0] = 0.0;
  for (int s = 1; s <= stages; ++s)
    for (int i = s; i <= layers; ++i)
      for (int j = s - 1; j < i; ++j) {
        const double c = std::max(best[s - 1][j], prefix[i] - prefix[j]);
        if (c < best[s][i]) best[s][i] = c, cut[s][i] = j;
      }
  std::vector<int> back{layers};
  for (int s = stages, i = layers; s > 0; --s) back.push_back(i = cut[s][i]);
  return {back.rbegin(), back.rend()};
}

std::vector<LayerRange> stage_chunks(const Config& cfg, const std::vector<int>& bounds, int stage) {
  std::vector<LayerRange> chunks;
  for (int c = 0; c < cfg.parallel.virtual_stages; ++c) {
    const auto j = static_cast<std::size_t>(c * cfg.parallel.pipeline + stage);
    chunks.push_back({bounds.at(j), bounds.at(j + 1)});
  }
  return chunks;
}

void check_model_size(const Config& cfg, const ModelShape& shape) {
  constexpr double kMaxTensor = 1099511627776.0;  // 2^40 elements
  constexpr double kMaxFeatures = 2147483647.0;   // values per sample travel as int extents
  const auto count = [](double v) { return fmt::format("{:.4g}", v); };
  if (static_cast<double>(shape.in_features) > kMaxFeatures || static_cast<double>(shape.outputs) > kMaxFeatures)
    throw InputError(fmt::format("the data's samples have {} values and {} outputs; at most {} each",
                                 shape.in_features, shape.outputs, count(kMaxFeatures)));
  double total = 0;
  const auto tensor = [&](double elements, const char* key, const std::string& what) {
    if (elements > kMaxTensor)
      throw InputError(fmt::format("{}: {} would hold {} values; a tensor holds at most 2^40", key, what,
                                   count(elements)));
    total += elements;
    if (total > kMaxTensor)
      throw InputError(fmt::format("{}: the model would hold more than 2^40 parameters", key));
  };
  // Linear layers from `in` through the hidden widths to the outputs.
  const auto linear = [&](double in) {
    for (std::size_t i = 0; i <= cfg.model.hidden.size(); ++i) {
      const double out = i < cfg.model.hidden.size() ? cfg.model.hidden[i] : static_cast<double>(shape.outputs);
      tensor(in * out + out, "model.hidden", fmt::format("linear layer {} ({} x {})", i, in, out));
      in = out;
    }
  };
  if (cfg.model.kind == ModelKind::gpt) {
    const double C = cfg.model.width, V = static_cast<double>(shape.outputs), T = cfg.model.context;
    tensor(V * C, "model.width", fmt::format("the token embedding ({} x {})", V, C));
    tensor(T * C, "model.context", fmt::format("the position embedding ({} x {})", T, C));
    for (int b = 0; b < cfg.model.layers; ++b)
      tensor(12 * C * C + 13 * C, "model.layers", fmt::format("block {}", b));
  } else if (cfg.model.kind == ModelKind::llama) {
    const double C = cfg.model.width, V = static_cast<double>(shape.outputs);
    tensor(V * C, "model.width", fmt::format("the token embedding ({} x {})", V, C));
    if (!cfg.model.tie_embeddings) tensor(V * C, "model.width", fmt::format("the output head ({} x {})", V, C));
    for (int b = 0; b < cfg.model.layers; ++b)
      tensor(block_weights(cfg) + 2 * C, "model.layers", fmt::format("block {}", b));
  } else if (cfg.model.kind == ModelKind::unet) {
    const nn::UNetShape u = unet_shape(cfg, shape);
    const double k2 = double(u.kernel) * u.kernel;
    double in = u.in_channels;
    for (std::size_t l = 0; l < u.levels.size(); ++l) {
      const double c = u.levels[l];
      tensor(c * in * k2 + c, "model.channels", fmt::format("down.{}.conv1 ({} x {} x {} x {})", l, c, in, u.kernel, u.kernel));
      tensor(c * c * k2 + c, "model.channels", fmt::format("down.{}.conv2", l));
      if (l > 0) {
        const double below = u.levels[l - 1];
        tensor(c * below * 4 + below, "model.channels", fmt::format("up.{}.upconv", l - 1));
        tensor(below * 2 * below * k2 + below, "model.channels", fmt::format("up.{}.conv1", l - 1));
        tensor(below * below * k2 + below, "model.channels", fmt::format("up.{}.conv2", l - 1));
      }
      in = c;
    }
  } else if (cfg.model.kind == ModelKind::cnn) {
    const nn::CnnShape c = cnn_shape(cfg, shape);
    double in = c.channels, h = c.height, w = c.width;
    for (std::size_t i = 0; i < c.conv.size(); ++i) {
      tensor(c.conv[i] * in * c.kernel * c.kernel + c.conv[i], "model.channels",
             fmt::format("convolution {} ({} x {} x {} x {})", i, c.conv[i], in, c.kernel, c.kernel));
      in = c.conv[i];
      h = std::floor(h / 2);
      w = std::floor(w / 2);
    }
    linear(in * h * w);
  } else {
    linear(static_cast<double>(shape.in_features));
  }
}

nn::CnnShape cnn_shape(const Config& cfg, const ModelShape& shape) {
  const auto& d = shape.sample_shape;
  if (d.size() != 2 && d.size() != 3)
    throw InputError(fmt::format("model.kind = \"cnn\" needs images, inputs of shape [N, H, W] or [N, C, H, W]; "
                                 "the data's samples have {} dimensions", d.size()));
  nn::CnnShape s;
  s.channels = d.size() == 3 ? static_cast<int>(d[0]) : 1;
  s.height = static_cast<int>(d[d.size() - 2]);
  s.width = static_cast<int>(d[d.size() - 1]);
  s.conv = cfg.model.channels;
  s.kernel = cfg.model.kernel;
  s.hidden = cfg.model.hidden;
  s.classes = static_cast<int>(shape.outputs);
  int h = s.height, w = s.width;
  for (std::size_t i = 0; i < s.conv.size(); ++i) {
    h /= 2;
    w /= 2;
    if (h < 1 || w < 1)
      throw InputError(fmt::format("model.channels: {} blocks of 2x2 max-pooling, but a {}x{} image vanishes "
                                   "after {}; use at most {} blocks", s.conv.size(), s.height, s.width, i + 1, i));
  }
  return s;
}

nn::UNetShape unet_shape(const Config& cfg, const ModelShape& shape) {
  const auto& in = shape.sample_shape;
  const auto& out = shape.target_shape;
  if (shape.classification || in.size() != 3 || out.size() != 3 || in[1] != out[1] || in[2] != out[2])
    throw InputError(fmt::format(
        "model.kind = \"unet\" maps fields to fields: inputs [N, C, H, W] and targets [N, C', H, W] of the same "
        "H x W (`tessera prepare darcy` writes them); data.path holds inputs [N, {}] and {}",
        fmt::join(in, ", "), shape.classification ? "class labels" : fmt::format("targets [N, {}]", fmt::join(out, ", "))));
  const auto& c = cfg.model.channels;
  const auto levels = static_cast<std::int64_t>(c.size());
  const std::int64_t H = in[1], W = in[2], S = cfg.parallel.spatial, p = cfg.model.kernel / 2;
  if (levels > 31)
    throw InputError(fmt::format("model.channels: {} levels; a unet has at most 31", levels));
  const std::int64_t f = std::int64_t{1} << (levels - 1), block = S * f;
  const char* key = S > 1 ? "parallel.spatial" : "model.channels";
  if (H % block != 0)
    throw InputError(fmt::format(
        "{}: the fields have H = {} rows; {} levels pool them {} time(s) by 2x2{}, so H must be a multiple of {} "
        "(every rank's rows even at every level); use fields of such H, fewer levels{}",
        key, H, levels, levels - 1,
        S > 1 ? fmt::format(", and parallel.spatial = {} splits them into blocks of rows", S) : std::string(),
        block, S > 1 ? " or another parallel.spatial" : ""));
  if (W % f != 0)
    throw InputError(fmt::format("model.channels: the fields have W = {} columns; {} levels pool them {} time(s) "
                                 "by 2x2, so W must be a multiple of {}", W, levels, levels - 1, f));
  if (H / block < p)
    throw InputError(fmt::format(
        "{}: each rank's block of the coarsest level holds {} row(s), fewer than the halo of model.kernel / 2 = {} "
        "rows a convolution reads beyond it; use fewer ranks per sample, fewer levels or a smaller kernel",
        key, H / block, p));
  if (H > std::int64_t{1} << 30 || W > std::int64_t{1} << 30)
    throw InputError(fmt::format("data.path: fields of {} x {}; at most 2^30 rows and columns", H, W));
  nn::UNetShape u;
  u.in_channels = static_cast<int>(in[0]);
  u.out_channels = static_cast<int>(out[0]);
  u.field_height = static_cast<int>(H);
  u.height = static_cast<int>(H / S);
  u.width = static_cast<int>(W);
  u.levels = c;
  u.kernel = cfg.model.kernel;
  u.activation = cfg.model.activation;
  u.norm = shape.norm;
  if (u.norm.empty() && normalizes_fields(cfg)) {
    // Without the statistics (tessera check's estimate, parameter lists): their place, so the
    // memory estimate counts the standardised input; training and eval pass the real ones.
    u.norm.in_mean.assign(std::size_t(u.in_channels), 0.0);
    u.norm.in_std.assign(std::size_t(u.in_channels), 1.0);
    u.norm.out_mean.assign(std::size_t(u.out_channels), 0.0);
    u.norm.out_std.assign(std::size_t(u.out_channels), 1.0);
  }
  return u;
}

nn::GptShape gpt_shape(const Config& cfg, const ModelShape& shape) {
  if (shape.in_features != cfg.model.context)
    throw InputError(fmt::format("model.context = {}, but the data gives sequences of {} tokens",
                                 cfg.model.context, shape.in_features));
  if (shape.outputs % cfg.parallel.tensor != 0)
    throw InputError(fmt::format("parallel.tensor = {} does not divide the vocabulary of {} tokens "
                                 "(the embedding and head split over the tensor ranks)",
                                 cfg.parallel.tensor, shape.outputs));
  nn::GptShape g{static_cast<int>(shape.outputs), cfg.model.context, cfg.model.width, cfg.model.heads,
                 cfg.model.layers, cfg.model.gelu_approximate == GeluApproximate::tanh};
  g.window = attention_window(cfg.model);
  if (cfg.model.kind == ModelKind::llama) {
    g.llama = true;
    g.kv_heads = cfg.model.kv_heads_or_heads();
    g.ffn = cfg.model.ffn_width_or_default();
    g.rope_theta = cfg.model.rope_theta;
    g.norm_eps = cfg.model.norm_eps;
    g.tied = cfg.model.tie_embeddings;
  }
  return g;
}

double block_weights(const Config& cfg) {
  const double C = cfg.model.width;
  if (cfg.model.kind != ModelKind::llama) return 12 * C * C;
  const double hd = C / cfg.model.heads, kv = cfg.model.kv_heads_or_heads(), F = cfg.model.ffn_width_or_default();
  return 2 * C * C + 2 * kv * hd * C + 3 * F * C;  // q, o; k, v; gate, up, down
}

std::unique_ptr<nn::Network<float>> make_network(nn::ParamStore<float>& store, const Config& cfg,
                                                 const ModelShape& shape, const ModelPart& part,
                                                 std::size_t chunk) {
  const LayerRange layers = part.chunks.at(chunk);
  if (cfg.model.kind == ModelKind::unet) {
    nn::UNet<float>::Part p;
    p.halo = part.halo;
    p.overlap = part.halo_overlap;
    p.conv = cfg.run.conv;
    p.precision = cfg.train.precision;
    return std::make_unique<nn::UNet<float>>(store, unet_shape(cfg, shape), std::move(p));
  }
  if (cfg.model.kind == ModelKind::cnn) {
    nn::Cnn<float>::Part p;
    p.tp = part.tp;
    p.t = part.t;
    p.tensor_sum = part.tensor_sum;
    p.conv = cfg.run.conv;
    p.precision = cfg.train.precision;
    return std::make_unique<nn::Cnn<float>>(store, cnn_shape(cfg, shape), std::move(p));
  }
  if (is_transformer(cfg.model.kind)) {
    nn::Gpt<float>::Part p;
    p.first_block = layers.first;
    p.end_block = layers.end;
    p.tp = part.tp;
    p.t = part.t;
    p.tensor_sum = part.tensor_sum;
    p.sp = part.sp;
    p.s = part.s;
    p.all_to_all = part.all_to_all;
    p.spatial_sum = part.spatial_sum;
    p.ring = part.ring;
    p.head_tail = part.ring && context_head_tail(cfg);  // where this part shares sequences
    p.messages = part.messages;
    p.wait = part.wait;
    p.recompute = cfg.train.recompute;
    p.precision = cfg.train.precision;
    return std::make_unique<nn::Gpt<float>>(store, gpt_shape(cfg, shape), std::move(p));
  }
  nn::Mlp<float>::Part p;
  p.first_layer = layers.first;
  p.end_layer = layers.end;
  p.tp = part.tp;
  p.t = part.t;
  p.tensor_sum = part.tensor_sum;
  p.precision = cfg.train.precision;
  return std::make_unique<nn::Mlp<float>>(store, static_cast<int>(shape.in_features),
                                          cfg.model.hidden, static_cast<int>(shape.outputs),
                                          cfg.model.activation, std::move(p));
}

std::string describe_model(const Config& cfg, const ModelShape& shape) {
  if (cfg.model.kind == ModelKind::unet) {
    const nn::UNetShape u = unet_shape(cfg, shape);
    const nn::FieldNorm& n = shape.norm;  // the statistics (not the estimate's placeholder)
    return fmt::format("unet {}x{}x{} -> {}x{}x{}, levels [{}] (two conv{}x{} + {} each, 2x2 max-pool down, 2x2 "
                       "transposed conv up, skip connections){}{}",
                       u.in_channels, u.field_height, u.width, u.out_channels, u.field_height, u.width,
                       fmt::join(u.levels, ", "), u.kernel, u.kernel, to_string(u.activation),
                       cfg.parallel.spatial > 1 ? fmt::format("; each rank holds {} of the {} rows (parallel.spatial = {})",
                                                              u.height, u.field_height, cfg.parallel.spatial)
                                                : std::string(),
                       n.empty() ? (u.norm.empty() ? std::string() : std::string("; fields standardised per channel (data.normalize)"))
                                 : fmt::format("; fields standardised per channel (data.normalize): inputs mean [{:.6g}] "
                                               "std [{:.6g}], targets mean [{:.6g}] std [{:.6g}]",
                                               fmt::join(n.in_mean, ", "), fmt::join(n.in_std, ", "),
                                               fmt::join(n.out_mean, ", "), fmt::join(n.out_std, ", ")));
  }
  const int w = attention_window(cfg.model);
  const std::string window = w > 0 ? fmt::format(" (sliding window {})", w) : std::string();
  if (cfg.model.kind == ModelKind::llama)
    return fmt::format("llama {} blocks x {} heads ({} key/value), width {}, SwiGLU {}, context {}{}, vocabulary {}, "
                       "RoPE theta {}, RMSNorm eps {}, {} head{}",
                       cfg.model.layers, cfg.model.heads, cfg.model.kv_heads_or_heads(), cfg.model.width,
                       cfg.model.ffn_width_or_default(), cfg.model.context, window, shape.outputs,
                       cfg.model.rope_theta, cfg.model.norm_eps, cfg.model.tie_embeddings ? "tied" : "untied",
                       cfg.train.recompute ? ", recomputing each block in backward" : "");
  if (cfg.model.kind == ModelKind::gpt)
    return fmt::format("gpt {} blocks x {} heads, width {}, context {}{}, vocabulary {}{}", cfg.model.layers,
                       cfg.model.heads, cfg.model.width, cfg.model.context, window, shape.outputs,
                       cfg.train.recompute ? ", recomputing each block in backward" : "");
  if (cfg.model.kind == ModelKind::cnn)
    return fmt::format("cnn {} -> conv{}x{} [{}] (ReLU, 2x2 max-pool each) -> linear [{}{}{}]",
                       fmt::join(shape.sample_shape, "x"), cfg.model.kernel, cfg.model.kernel,
                       fmt::join(cfg.model.channels, ", "), fmt::join(cfg.model.hidden, ", "),
                       cfg.model.hidden.empty() ? "" : ", ", shape.outputs);
  return fmt::format("mlp {}-{}{}{}", shape.in_features, fmt::join(cfg.model.hidden, "-"),
                     cfg.model.hidden.empty() ? "" : "-", shape.outputs);
}

std::vector<nn::ParamInfo> logical_params(const Config& cfg, const ModelShape& shape) {
  nn::ParamStore<float> store;  // registration only: nothing is allocated
  make_network(store, cfg, shape);
  return store.infos();
}

Model::Model(const Config& cfg, const ModelShape& shape, int max_batch, const ParamLayout& layout,
             ModelPart part)
    : shape_(shape), max_batch_(max_batch), store_(std::make_unique<nn::ParamStore<float>>()) {
  halo_ = part.halo;
  context_ = part.context;
  std::vector<std::pair<std::size_t, std::size_t>> params;  // per chunk: its parameters [first, end)
  for (std::size_t c = 0; c < part.chunks.size(); ++c) {
    // A chunk's backwards run apart from the others': each completes its own buckets.
    if (c > 0) store_->begin_bucket();
    const std::size_t first = store_->infos().size();
    nets_.push_back(make_network(*store_, cfg, shape, part, c));
    params.emplace_back(first, store_->infos().size());
  }
  store_->plan(layout.shards, layout.bucket_elements);
  store_->allocate(layout.storage);
  if (layout.storage.full_values) store_->initialize(ExecSpace(), cfg.run.seed);
  const auto& infos = store_->infos();
  for (const auto& [first, end] : params)
    units_.emplace_back(first < end ? infos[first].unit : 0, first < end ? infos[end - 1].unit + 1 : 0);
  for (auto& net : nets_) net->reserve(max_batch);
}

void Model::set_hooks(nn::LayerHooks* hooks) {
  hooks_ = hooks;
  for (auto& net : nets_) net->set_hooks(hooks);
}

int Model::acquire(int c, int rows) {
  const int slot = net(c).acquire(rows);
  peak_ = std::max(peak_, ++live_);
  return slot;
}

void Model::release(int c, int slot) {
  net(c).release(slot);
  --live_;
}

void Model::idle_forward(int c) {
  if (!hooks_) return;
  const auto [first, end] = units_.at(static_cast<std::size_t>(c));
  for (std::size_t u = first; u < end; ++u) {
    hooks_->before_forward(u);
    hooks_->after_forward(u);
  }
}

void Model::idle_backward(int c) {
  if (!hooks_) return;
  const auto [first, end] = units_.at(static_cast<std::size_t>(c));
  for (std::size_t u = end; u-- > first;) {
    hooks_->before_backward(u);
    hooks_->after_backward(u);
  }
}

LossSums Model::loss(const ExecSpace& exec, int slot, VectorU<const std::int32_t> labels,
                     MatrixU<const float> targets, float scale) {
  return nets_.back()->loss(exec, slot, shape_.classification ? labels : VectorU<const std::int32_t>(),
                    targets, scale);
}

}  // namespace tessera
