#include "optim/optimizer.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <new>
#include <stdexcept>
#include <type_traits>

#include <fmt/format.h>

#include "core/error.hpp"
#include "core/memory.hpp"
#include "core/test_hooks.hpp"
#include "kernels/optimizer.hpp"
#include "optim/state_file.hpp"

namespace tessera {

void Optimizer::AlignedFree::operator()(float* p) const { std::free(p); }

double OffloadPlan::buffer_bytes() const {
  return static_cast<double>(depth * tile) * (4.0 * static_cast<double>(streams) + (staged ? 2.0 : 0.0));
}

OffloadPlan offload_plan(const OptimizerConfig& cfg, std::size_t states, std::size_t n, bool staged, bool values) {
  const std::size_t block = StateFile::kBlock;
  OffloadPlan p;
  p.depth = cfg.offload_overlap ? 3 : 1;
  p.padded = (n + block - 1) / block * block;
  p.streams = (cfg.offload == OptimizerOffload::disk ? states : 0) + (values ? 1 : 0) + (staged ? (values ? 1 : 2) : 0);
  p.staged = staged;
  const auto buffer = static_cast<std::size_t>(cfg.offload_buffer_mb * 1e6 / sizeof(float));
  const std::size_t tile =
      std::max<std::size_t>(1, buffer / std::max<std::size_t>(1, p.streams) / p.depth / block) * block;
  p.tile = std::max(block, std::min(tile, p.padded));
  return p;
}

bool offload_staged(const OptimizerConfig& cfg) {
  if (cfg.offload == OptimizerOffload::none) return false;
  return !Kokkos::SpaceAccessibility<HostSpace, Vector<float>::memory_space>::accessible || test_hooks::stage_offload();
}

Optimizer::Optimizer(const OptimizerConfig& cfg, std::size_t n, int rank, StateFile* values)
    : cfg_(cfg), n_(n), values_(values) {
  if (cfg.kind == OptimizerKind::adamw)
    names_ = {"exp_avg", "exp_avg_sq"};
  else if (cfg.momentum > 0.0)
    names_ = {"momentum"};
  staged_ = offload_staged(cfg) && n > 0;
  const bool disk = cfg.offload == OptimizerOffload::disk && !names_.empty();
  if (!disk && !staged_) {  // with the parameters (optimizer.offload = "host" on a CPU build too)
    for (const auto& name : names_) states_.emplace_back(mem::label(mem::Category::optim, "tessera::Optimizer::" + name), n);
    if (values_ == nullptr) return;
  }
  const OffloadPlan plan = offload_plan(cfg, names_.size(), n, staged_, values_ != nullptr);
  depth_ = plan.depth;
  tile_ = plan.tile;
  padded_ = plan.padded;
  if (staged_) {
    // The update runs on the host: the state in host memory (or on disk), the parameters' and
    // gradients' tiles (and the bf16 copies') staged.
    if (!disk)
      for (const auto& name : names_)
        host_states_.emplace_back(mem::label(mem::Category::optim, "tessera::Optimizer::host_" + name), n);
    for (std::size_t b = 0; b < depth_; ++b) {
      if (values_ == nullptr)  // values on disk come to the host in their own tiles
        stage_p_.emplace_back(mem::label(mem::Category::optim, "tessera::Optimizer::stage_values"), tile_);
      stage_g_.emplace_back(mem::label(mem::Category::optim, "tessera::Optimizer::stage_grads"), tile_);
      stage_bf16_.emplace_back(mem::label(mem::Category::optim, "tessera::Optimizer::stage_bf16"), tile_);
    }
  }
  if (!disk && values_ == nullptr) return;
  // The buffer holds `depth_` tiles of every state on disk and of the values there (the one
  // updated, the next read, the last written); a tile is whole blocks, at least one.
  const std::size_t block = StateFile::kBlock;
  if (disk) file_ = std::make_unique<StateFile>(offload_dir(cfg.offload_path), rank, names_.size(), n);
  const std::size_t streams = (disk ? names_.size() : 0) + (values_ != nullptr ? 1 : 0);
  for (std::size_t i = 0; i < streams * depth_; ++i) {
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
  io_.reset();  // before the buffers they may still be writing from
  values_io_.reset();
  if (!tiles_.empty()) mem::count_external(mem::Category::optim, -static_cast<std::int64_t>(tiles_.size() * tile_ * sizeof(float)));
}

std::string Optimizer::kind_name() const {
  return cfg_.kind == OptimizerKind::adamw ? "adamw" : "sgd";
}

std::string Optimizer::describe_offload() const {
  const std::string staging =
      staged_ ? fmt::format("; the update on the host, the parameters and gradients staged in tiles of {:.2f} MB{}",
                            static_cast<double>(tile_) * sizeof(float) / 1e6,
                            depth_ > 1 ? ", the next copied down and the last up during each update" : ", one at a time")
              : std::string();
  const std::string values = values_ != nullptr ? "; the parameter values streamed from their file beside it" : "";
  if (file_ || values_ != nullptr)
    return fmt::format("disk, {} state buffer(s) of {:.1f} MB in {}, streamed in tiles of {:.2f} MB per buffer{}{}{}",
                       names_.size(), static_cast<double>(n_) * sizeof(float) / 1e6,
                       file_ ? file_->describe() : std::string("no file"), static_cast<double>(tile_) * sizeof(float) / 1e6,
                       depth_ > 1 ? ", the next read and the last written during each update" : ", one at a time",
                       values, staging);
  if (staged_)
    return fmt::format("host, {} state buffer(s) of {:.1f} MB in host memory{}", names_.size(),
                       static_cast<double>(n_) * sizeof(float) / 1e6, staging);
  if (cfg_.offload == OptimizerOffload::host)
    return "host: this build keeps the parameters in host memory, and the state with them already; "
           "optimizer.offload = \"host\" changes nothing here";
  return "memory";
}

void Optimizer::update(const ExecSpace& exec, VectorU<float> params, VectorU<float> grads,
                       double lr, std::size_t state_offset, const kernels::UpdateExtras& extras) {
  const std::size_t n = params.size();
  if (!names_.empty() && state_offset + n > n_)
    throw std::logic_error("tessera::Optimizer::update: piece beyond the optimizer state");
  // The kernel on `count` elements: parameters p, gradients g, bf16 copies (or nullptr), state.
  const auto step = [&](const auto& on, const auto& p, const auto& g, std::uint16_t* bf16, std::size_t count,
                        const std::vector<float*>& state) {
    using Space = typename std::remove_cvref_t<decltype(p)>::memory_space;
    const VectorU<float, Space> pv(p.data(), count), gv(g.data(), count);
    kernels::UpdateExtrasIn<Space> x{extras.grad_factor, {}};
    if (bf16 != nullptr) x.bf16 = VectorU<std::uint16_t, Space>(bf16, count);
    if (cfg_.kind == OptimizerKind::adamw) {
      const kernels::AdamWHyper h{lr, cfg_.beta1, cfg_.beta2, cfg_.eps, cfg_.weight_decay};
      kernels::adamw_step(on, pv, gv, VectorU<float, Space>(state[0], count), VectorU<float, Space>(state[1], count),
                          h, steps_, x);
    } else {
      const kernels::SgdHyper h{lr, cfg_.momentum, cfg_.weight_decay, cfg_.nesterov};
      kernels::sgd_step(on, pv, gv, state.empty() ? VectorU<float, Space>() : VectorU<float, Space>(state[0], count),
                        h, x);
    }
  };
  if (!file_ && !staged_ && values_ == nullptr) {
    std::vector<float*> state;
    for (const auto& s : states_) state.push_back(s.data() + state_offset);
    step(exec, params, grads, extras.bf16.extent(0) > 0 ? extras.bf16.data() : nullptr, n, state);
    return;
  }
  // Offloaded: tile by tile. On disk each tile is read as whole blocks from the file, updated in
  // place and written back; the I/O thread reads up to depth_ - 1 tiles ahead and writes behind;
  // tile k uses buffer k % depth_, whose last write (tile k - depth_) was queued before tile k's
  // read. Staged, tile k's parameters and gradients are copied down into staging buffer k % depth_
  // (depth_ - 1 tiles ahead, on `exec`'s stream, in order with the copies up), updated on the
  // host, and the parameters (and their bf16 copies) copied up behind. Values in a file (values_)
  // stream as one more state: read ahead, updated in their tile, written behind; never staged.
  struct Tile {
    std::size_t first, last;  // its whole blocks in the file
    std::size_t at, stop;     // the piece's elements in it
  };
  const auto t0 = std::chrono::steady_clock::now();
  if (file_ && !io_) io_ = std::make_unique<StateIo>(*file_);
  if (values_ != nullptr && !values_io_) values_io_ = std::make_unique<StateIo>(*values_);
  const std::size_t block = StateFile::kBlock, end = state_offset + n;
  const std::size_t on_disk = file_ ? names_.size() : 0;  // the values' tiles follow the states'
  std::vector<Tile> tiles;
  for (std::size_t at = state_offset; at < end;) {
    const std::size_t first = at / block * block;
    const std::size_t stop = std::min(end, first + tile_);
    tiles.push_back({first, std::min((stop + block - 1) / block * block, file_ || values_ ? padded_ : n_), at, stop});
    at = stop;
  }
  const auto buffer = [&](std::size_t s, std::size_t k) { return tiles_[s * depth_ + k % depth_].get(); };
  const bool copies = extras.bf16.extent(0) > 0;
  // The piece's elements of tile k, in the parameters' memory; tile k's staging buffer.
  const auto piece = [&](auto* data, std::size_t k) {
    using T = std::remove_pointer_t<decltype(data)>;
    return VectorU<T>(data + (tiles[k].at - state_offset), tiles[k].stop - tiles[k].at);
  };
  const auto stage = [&](const auto& buffers, std::size_t k) {
    using T = typename std::remove_cvref_t<decltype(buffers[0])>::value_type;
    return VectorU<T, PinnedSpace>(buffers[k % depth_].data(), tiles[k].stop - tiles[k].at);
  };
  std::vector<std::uint64_t> read(tiles.size(), 0), read_values(tiles.size(), 0);
  const auto fetch = [&](std::size_t k) {
    const std::size_t blocks = tiles[k].last - tiles[k].first;
    if (file_)
      for (std::size_t s = 0; s < names_.size(); ++s) {
        read[k] = io_->read(s, tiles[k].first, blocks, buffer(s, k));
        traffic_.read += static_cast<double>(blocks) * sizeof(float);
      }
    if (values_ != nullptr) {
      read_values[k] = values_io_->read(0, tiles[k].first, blocks, buffer(on_disk, k));
      traffic_.read += static_cast<double>(blocks) * sizeof(float);
    }
    if (staged_) {
      if (values_ == nullptr) Kokkos::deep_copy(exec, stage(stage_p_, k), piece(params.data(), k));
      Kokkos::deep_copy(exec, stage(stage_g_, k), piece(grads.data(), k));
    }
  };
  const std::size_t ahead = depth_ - 1;
  std::uint64_t written = 0, written_values = 0;
  for (std::size_t k = 0; k < std::min(ahead, tiles.size()); ++k) fetch(k);
  for (std::size_t k = 0; k < tiles.size(); ++k) {
    if (ahead == 0) fetch(k);
    if (staged_) exec.fence();  // tile k is down, tile k - 1 up
    if (ahead > 0 && k + ahead < tiles.size()) fetch(k + ahead);  // into the buffer tile k - 1 used
    if (file_) io_->wait(read[k]);
    if (values_ != nullptr) values_io_->wait(read_values[k]);
    const std::size_t skip = tiles[k].at - tiles[k].first, count = tiles[k].stop - tiles[k].at;
    std::vector<float*> state;
    for (std::size_t s = 0; s < names_.size(); ++s)
      state.push_back(file_                   ? buffer(s, k) + skip
                      : !host_states_.empty() ? host_states_[s].data() + tiles[k].at
                                              : states_[s].data() + tiles[k].at);
    float* const values = values_ != nullptr ? buffer(on_disk, k) + skip : nullptr;
    if (staged_) {
      const Kokkos::DefaultHostExecutionSpace host;
      const VectorU<float, PinnedSpace> p = values != nullptr ? VectorU<float, PinnedSpace>(values, count) : stage(stage_p_, k);
      const VectorU<float, PinnedSpace> g = stage(stage_g_, k);
      step(host, p, g, copies ? stage_bf16_[k % depth_].data() : nullptr, count, state);
      host.fence();
      if (values == nullptr) Kokkos::deep_copy(exec, piece(params.data(), k), p);
      if (copies) Kokkos::deep_copy(exec, piece(extras.bf16.data(), k), stage(stage_bf16_, k));
    } else {
      step(exec, values != nullptr ? VectorU<float>(values, count) : piece(params.data(), k), piece(grads.data(), k),
           copies ? piece(extras.bf16.data(), k).data() : nullptr, count, state);
      exec.fence();
    }
    const std::size_t blocks = tiles[k].last - tiles[k].first;
    if (file_)
      for (std::size_t s = 0; s < names_.size(); ++s) {
        written = io_->write(s, tiles[k].first, blocks, buffer(s, k));
        traffic_.written += static_cast<double>(blocks) * sizeof(float);
      }
    if (values_ != nullptr) {
      written_values = values_io_->write(0, tiles[k].first, blocks, buffer(on_disk, k));
      traffic_.written += static_cast<double>(blocks) * sizeof(float);
    }
  }
  if (staged_) exec.fence();               // the parameters are up
  if (written > 0) io_->wait(written);     // the next update may read these blocks
  if (written_values > 0) values_io_->wait(written_values);  // and the next gather these values
  traffic_.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void Optimizer::copy_state(std::size_t i, std::size_t at, std::size_t n, float* out) const {
  if (at + n > n_) throw std::logic_error("tessera::Optimizer::copy_state: beyond the state");
  if (!host_states_.empty()) {
    std::copy_n(host_states_[i].data() + at, n, out);
    return;
  }
  if (!file_) {
    Kokkos::deep_copy(Kokkos::View<float*, HostSpace, Kokkos::MemoryUnmanaged>(out, n),
                      Kokkos::subview(states_[i], std::pair<std::size_t, std::size_t>(at, at + n)));
    return;
  }
  file_->read_range(i, at, n, out, tiles_[i * depth_].get(), tile_);  // through the state's first tile
}

void Optimizer::set_state(std::size_t i, std::size_t at, std::size_t n, const float* in) {
  if (at + n > n_) throw std::logic_error("tessera::Optimizer::set_state: beyond the state");
  if (!host_states_.empty()) {
    std::copy_n(in, n, host_states_[i].data() + at);
    return;
  }
  if (!file_) {
    Kokkos::deep_copy(Kokkos::subview(states_[i], std::pair<std::size_t, std::size_t>(at, at + n)),
                      Kokkos::View<const float*, HostSpace, Kokkos::MemoryUnmanaged>(in, n));
    return;
  }
  file_->write_range(i, at, n, in, tiles_[i * depth_].get(), tile_);  // through the state's first tile
}

}  // namespace tessera
