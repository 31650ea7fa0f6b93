#include "optim/optimizer.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <new>
#include <stdexcept>

#include <fmt/format.h>

#include "core/error.hpp"
#include "core/memory.hpp"
#include "kernels/optimizer.hpp"
#include "optim/state_file.hpp"

namespace tessera {

void Optimizer::AlignedFree::operator()(float* p) const { std::free(p); }

Optimizer::Optimizer(const OptimizerConfig& cfg, std::size_t n, int rank) : cfg_(cfg), n_(n) {
  if (cfg.kind == OptimizerKind::adamw)
    names_ = {"exp_avg", "exp_avg_sq"};
  else if (cfg.momentum > 0.0)
    names_ = {"momentum"};
  if (cfg.offload == OptimizerOffload::none || names_.empty()) {
    for (const auto& name : names_) states_.emplace_back(mem::label(mem::Category::optim, "tessera::Optimizer::" + name), n);
    return;
  }
  if constexpr (!Kokkos::SpaceAccessibility<HostSpace, Vector<float>::memory_space>::accessible)
    throw InputError("optimizer.offload = \"disk\": this build keeps the parameters on a GPU, whose updates "
                     "the disk offload does not stream yet; set optimizer.offload = \"none\"");
  // The buffer holds one tile of every state; a tile is whole blocks, at least one.
  const std::size_t block = StateFile::kBlock;
  const auto buffer = static_cast<std::size_t>(cfg.offload_buffer_mb * 1e6 / sizeof(float));
  tile_ = std::max<std::size_t>(1, buffer / names_.size() / block) * block;
  file_ = std::make_unique<StateFile>(offload_dir(cfg.offload_path), rank, names_.size(), n);
  tile_ = std::min(tile_, file_->padded());
  for (std::size_t i = 0; i < names_.size(); ++i) {
    void* p = std::aligned_alloc(block * sizeof(float), std::max<std::size_t>(tile_, block) * sizeof(float));
    if (p == nullptr) throw std::bad_alloc();
    tiles_.emplace_back(static_cast<float*>(p));
    std::fill_n(tiles_.back().get(), std::max<std::size_t>(tile_, block), 0.0f);
  }
  mem::count_external(mem::Category::optim, static_cast<std::int64_t>(names_.size() * tile_ * sizeof(float)));
  // The reserved space reads as zeros: a fresh state, as in memory.
}

Optimizer::~Optimizer() {
  if (file_) mem::count_external(mem::Category::optim, -static_cast<std::int64_t>(names_.size() * tile_ * sizeof(float)));
}

std::string Optimizer::kind_name() const {
  return cfg_.kind == OptimizerKind::adamw ? "adamw" : "sgd";
}

std::string Optimizer::describe_offload() const {
  if (!file_) return "memory";
  return fmt::format("disk, {} state buffer(s) of {:.1f} MB in {}, streamed in tiles of {:.2f} MB per buffer",
                     names_.size(), static_cast<double>(n_) * sizeof(float) / 1e6, file_->describe(),
                     static_cast<double>(tile_) * sizeof(float) / 1e6);
}

void Optimizer::update(const ExecSpace& exec, VectorU<float> params, VectorU<float> grads,
                       double lr, std::size_t state_offset, const kernels::UpdateExtras& extras) {
  const std::size_t n = params.size();
  if (!names_.empty() && state_offset + n > n_)
    throw std::logic_error("tessera::Optimizer::update: piece beyond the optimizer state");
  // The kernel on elements [begin, begin + count) of the piece, its state at `state`.
  const auto step = [&](std::size_t begin, std::size_t count, const std::vector<float*>& state) {
    const VectorU<float> p(params.data() + begin, count), g(grads.data() + begin, count);
    kernels::UpdateExtras x{extras.grad_factor, {}};
    if (extras.bf16.extent(0) > 0) x.bf16 = VectorU<std::uint16_t>(extras.bf16.data() + begin, count);
    if (cfg_.kind == OptimizerKind::adamw) {
      const kernels::AdamWHyper h{lr, cfg_.beta1, cfg_.beta2, cfg_.eps, cfg_.weight_decay};
      kernels::adamw_step(exec, p, g, VectorU<float>(state[0], count), VectorU<float>(state[1], count), h, steps_, x);
    } else {
      const kernels::SgdHyper h{lr, cfg_.momentum, cfg_.weight_decay, cfg_.nesterov};
      kernels::sgd_step(exec, p, g, state.empty() ? VectorU<float>() : VectorU<float>(state[0], count), h, x);
    }
  };
  if (!file_) {
    std::vector<float*> state;
    for (const auto& s : states_) state.push_back(s.data() + state_offset);
    step(0, n, state);
    return;
  }
  // Offloaded: tile by tile, each read whole blocks from the file, updated in place, written back.
  const std::size_t block = StateFile::kBlock, end = state_offset + n;
  for (std::size_t at = state_offset; at < end;) {
    const std::size_t first = at / block * block;                       // the tile's first element in the file
    const std::size_t stop = std::min(end, first + tile_);              // the piece's elements in this tile end here
    const std::size_t last = std::min((stop + block - 1) / block * block, file_->padded());
    std::vector<float*> state;
    for (std::size_t s = 0; s < names_.size(); ++s) {
      file_->read(s, first, last - first, tiles_[s].get());
      state.push_back(tiles_[s].get() + (at - first));
    }
    step(at - state_offset, stop - at, state);
    exec.fence();
    for (std::size_t s = 0; s < names_.size(); ++s) file_->write(s, first, last - first, tiles_[s].get());
    at = stop;
  }
}

Optimizer::HostState Optimizer::host_state(std::size_t i) const {
  HostState h;
  if (!file_ && Kokkos::SpaceAccessibility<HostSpace, Vector<float>::memory_space>::accessible) {
    h.view_ = Kokkos::View<const float*, HostSpace>(states_[i].data(), n_);
    return h;
  }
  h.copy_.resize(n_);
  copy_state(i, h.copy_.data());
  return h;
}

void Optimizer::copy_state(std::size_t i, float* out) const {
  if (!file_) {
    Kokkos::deep_copy(Kokkos::View<float*, HostSpace, Kokkos::MemoryUnmanaged>(out, n_), states_[i]);
    return;
  }
  for (std::size_t at = 0; at < n_; at += tile_) {
    const std::size_t count = std::min(tile_, n_ - at);
    file_->read(i, at, std::min(tile_, file_->padded() - at), tiles_[i].get());
    std::copy_n(tiles_[i].get(), count, out + at);
  }
}

void Optimizer::set_state(std::size_t i, const float* in) {
  if (!file_) {
    Kokkos::deep_copy(states_[i], Kokkos::View<const float*, HostSpace, Kokkos::MemoryUnmanaged>(in, n_));
    return;
  }
  for (std::size_t at = 0; at < n_; at += tile_) {
    const std::size_t count = std::min(tile_, n_ - at);
    std::fill_n(tiles_[i].get(), tile_, 0.0f);
    std::copy_n(in + at, count, tiles_[i].get());
    file_->write(i, at, std::min(tile_, file_->padded() - at), tiles_[i].get());
  }
}

}  // namespace tessera
