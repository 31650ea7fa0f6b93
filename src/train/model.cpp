#include "train/model.hpp"

#include "core/memory.hpp"
#include "nn/loss.hpp"

namespace tessera {

Model::Model(const Config& cfg, const ModelShape& shape, int max_batch, const ParamLayout& layout)
    : shape_(shape), max_batch_(max_batch), store_(std::make_unique<nn::ParamStore<float>>()) {
  mlp_ = std::make_unique<nn::Mlp<float>>(*store_, static_cast<int>(shape.in_features),
                                          cfg.model.hidden, static_cast<int>(shape.outputs),
                                          cfg.model.activation);
  store_->plan(layout.shards, layout.bucket_elements);
  store_->allocate(layout.storage);
  if (layout.storage.full_values) store_->initialize(ExecSpace(), cfg.run.seed);
  mlp_->reserve(max_batch);
  dlogits_ = Matrix<float>(mem::label(mem::Category::act, "tessera::Model::dlogits"), static_cast<std::size_t>(max_batch),
                           static_cast<std::size_t>(shape.outputs));
}

void Model::set_hooks(nn::LayerHooks* hooks) {
  hooks_ = hooks;
  mlp_->set_hooks(hooks);
}

void Model::idle_forward() {
  if (!hooks_) return;
  for (std::size_t u = 0; u < store_->units(); ++u) {
    hooks_->before_forward(u);
    hooks_->after_forward(u);
  }
}

void Model::idle_backward() {
  if (!hooks_) return;
  for (std::size_t u = store_->units(); u-- > 0;) {
    hooks_->before_backward(u);
    hooks_->after_backward(u);
  }
}

LossSums Model::loss(const ExecSpace& exec, MatrixU<const float> logits,
                     VectorU<const std::int32_t> labels, MatrixU<const float> targets, float scale) {
  const MatrixU<float> d(dlogits_.data(), logits.extent(0), logits.extent(1));
  const nn::LossResult r = shape_.classification
                               ? nn::cross_entropy(exec, logits, labels, scale, d)
                               : nn::mean_squared_error(exec, logits, targets, scale, d);
  return {r.loss_sum, static_cast<double>(r.correct)};
}

LossSums Model::forward(const ExecSpace& exec, MatrixU<const float> x,
                        VectorU<const std::int32_t> labels, MatrixU<const float> targets,
                        float loss_scale) {
  const MatrixU<float> logits = mlp_->forward(exec, x);
  return loss(exec, logits, labels, targets, loss_scale);
}

void Model::backward(const ExecSpace& exec) {
  const int b = static_cast<int>(mlp_->batch());
  mlp_->backward(exec, MatrixU<const float>(dlogits_.data(), b, dlogits_.extent(1)));
}

LossSums Model::forward_loss(const ExecSpace& exec, MatrixU<const float> x,
                             VectorU<const std::int32_t> labels, MatrixU<const float> targets) {
  return forward(exec, x, labels, targets, 0.0f);
}

std::size_t Model::activation_bytes() const {
  return mlp_->activation_bytes() + dlogits_.span() * sizeof(float);
}

}  // namespace tessera
