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

OffloadPlan offload_plan(const OptimizerConfig& cfg, std::size_t states, std::size_t n) {
  const std::size_t block = StateFile::kBlock;
  OffloadPlan p;
  p.depth = cfg.offload_overlap ? 3 : 1;
  p.padded = (n + block - 1) / block * block;
  const auto buffer = static_cast<std::size_t>(cfg.offload_buffer_mb * 1e6 / sizeof(float));
  const std::size_t tile = std::max<std::size_t>(1, buffer / std::max<std::size_t>(1, states) / p.depth / block) * block;
  p.tile = std::max(block, std::min(tile, p.padded));
  return p;
}

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
  // The buffer holds `depth_` tiles of every state (the one updated, the next read, the last
  // written); a tile is whole blocks, at least one.
  const std::size_t block = StateFile::kBlock;
  const OffloadPlan plan = offload_plan(cfg, names_.size(), n);
  depth_ = plan.depth;
  tile_ = plan.tile;
  file_ = std::make_unique<StateFile>(offload_dir(cfg.offload_path), rank, names_.size(), n);
  for (std::size_t i = 0; i < names_.size() * depth_; ++i) {
    void* p = std::aligned_alloc(block * sizeof(float), tile_ * sizeof(float));
    if (p == nullptr) throw std::bad_alloc();
    tiles_.emplace_back(static_cast<float*>(p));
    std::fill_n(tiles_.back().get(), tile_, 0.0f);
  }
  mem::count_external(mem::Category::optim, static_cast<std::int64_t>(tiles_.size() * tile_ * sizeof(float)));
  // The I/O thread starts with the first update: a resume's checkpoint probe forks this process
  // before that, and a thread still starting (allocating) when it forks can leave the child
  // waiting for an allocator lock for ever (seen under AddressSanitizer).
  // The reserved space reads as zeros: a fresh state, as in memory.
}

Optimizer::~Optimizer() {
  io_.reset();  // before the buffers it may still be writing from
  if (file_) mem::count_external(mem::Category::optim, -static_cast<std::int64_t>(tiles_.size() * tile_ * sizeof(float)));
}

std::string Optimizer::kind_name() const {
  return cfg_.kind == OptimizerKind::adamw ? "adamw" : "sgd";
}

std::string Optimizer::describe_offload() const {
  if (!file_) return "memory";
  return fmt::format("disk, {} state buffer(s) of {:.1f} MB in {}, streamed in tiles of {:.2f} MB per buffer{}",
                     names_.size(), static_cast<double>(n_) * sizeof(float) / 1e6, file_->describe(),
                     static_cast<double>(tile_) * sizeof(float) / 1e6,
                     depth_ > 1 ? ", the next read and the last written during each update" : ", one at a time");
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
  // Offloaded: tile by tile, each read as whole blocks from the file, updated in place and written
  // back. The I/O thread reads up to depth_ - 1 tiles ahead and writes behind; tile k uses buffer
  // k % depth_, whose last write (tile k - depth_) was queued before tile k's read.
  struct Tile {
    std::size_t first, last;  // its whole blocks in the file
    std::size_t at, stop;     // the piece's elements in it
  };
  if (!io_) io_ = std::make_unique<StateIo>(*file_);
  const std::size_t block = StateFile::kBlock, end = state_offset + n;
  std::vector<Tile> tiles;
  for (std::size_t at = state_offset; at < end;) {
    const std::size_t first = at / block * block;
    const std::size_t stop = std::min(end, first + tile_);
    tiles.push_back({first, std::min((stop + block - 1) / block * block, file_->padded()), at, stop});
    at = stop;
  }
  const auto buffer = [&](std::size_t s, std::size_t k) { return tiles_[s * depth_ + k % depth_].get(); };
  std::vector<std::uint64_t> read(tiles.size(), 0);
  const auto fetch = [&](std::size_t k) {
    for (std::size_t s = 0; s < names_.size(); ++s)
      read[k] = io_->read(s, tiles[k].first, tiles[k].last - tiles[k].first, buffer(s, k));
  };
  std::uint64_t written = 0;
  for (std::size_t k = 0; k < std::min(depth_ - 1, tiles.size()); ++k) fetch(k);
  for (std::size_t k = 0; k < tiles.size(); ++k) {
    if (k + depth_ - 1 < tiles.size()) fetch(k + depth_ - 1);  // into the buffer tile k - 1 is written from
    io_->wait(read[k]);
    std::vector<float*> state;
    for (std::size_t s = 0; s < names_.size(); ++s) state.push_back(buffer(s, k) + (tiles[k].at - tiles[k].first));
    step(tiles[k].at - state_offset, tiles[k].stop - tiles[k].at, state);
    exec.fence();
    for (std::size_t s = 0; s < names_.size(); ++s)
      written = io_->write(s, tiles[k].first, tiles[k].last - tiles[k].first, buffer(s, k));
  }
  if (written > 0) io_->wait(written);  // the next update may read these blocks
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
    file_->read(i, at, std::min(tile_, file_->padded() - at), tiles_[i * depth_].get());
    std::copy_n(tiles_[i * depth_].get(), count, out + at);
  }
}

void Optimizer::set_state(std::size_t i, const float* in) {
  if (!file_) {
    Kokkos::deep_copy(states_[i], Kokkos::View<const float*, HostSpace, Kokkos::MemoryUnmanaged>(in, n_));
    return;
  }
  for (std::size_t at = 0; at < n_; at += tile_) {
    const std::size_t count = std::min(tile_, n_ - at);
    std::fill_n(tiles_[i * depth_].get(), tile_, 0.0f);
    std::copy_n(in + at, count, tiles_[i * depth_].get());
    file_->write(i, at, std::min(tile_, file_->padded() - at), tiles_[i * depth_].get());
  }
}

}  // namespace tessera
