#include "train/context_traffic.hpp"

#include <algorithm>

#include <fmt/format.h>

#include "train/trainer.hpp"

namespace tessera {

double ContextTraffic::sent(int r) const {
  double s = 0;
  for (int q = 0; q < ranks; ++q)
    if (q != r) s += between(r, q);
  return s;
}

double ContextTraffic::counted(int r) const { return sent(r) + between(r, r) + loss_sums; }

ContextTraffic context_traffic(const Config& cfg, const ModelShape& shape, int stage, std::int64_t rows) {
  ContextTraffic t;
  const int C = cfg.parallel.spatial;
  if (!is_transformer(cfg.model.kind) || C < 2) return t;
  const auto& m = cfg.model;
  t.ranks = C;
  t.bytes.assign(static_cast<std::size_t>(C) * static_cast<std::size_t>(C), 0.0);
  for (const LayerRange& c : stage_chunks(cfg, stage_bounds(cfg, shape), stage)) t.blocks += c.end - c.first;
  t.samples = rows > 0 ? rows : micro_batch_rows(cfg);
  t.micro_batches = cfg.parallel.micro_batches;
  const int tp = cfg.parallel.tensor;
  const double h = static_cast<double>(m.heads / tp);
  const double h_kv = static_cast<double>((m.kind == ModelKind::llama ? m.kv_heads_or_heads() : m.heads) / tp);
  const double hd = static_cast<double>(m.width / m.heads), n = static_cast<double>(m.context / C);
  // Each message's elements are counted once per block and micro-batch of the step, in bytes.
  const double per = 4.0 * static_cast<double>(t.blocks) * static_cast<double>(t.samples) * t.micro_batches;
  const double forwards = cfg.train.recompute ? 2.0 : 1.0;
  const auto add = [&](int from, int to, double elements) {
    t.bytes[static_cast<std::size_t>(from * C + to)] += per * elements;
  };
  if (cfg.parallel.context_comm == ContextComm::all_to_all) {
    // 4 all-to-alls of B n h hd elements per forward (q, k, v; y) and 4 backward (dy; dq, dk, dv),
    // 1/C of each to every rank.
    for (int r = 0; r < C; ++r)
      for (int q = 0; q < C; ++q) add(r, q, (4.0 * forwards + 4.0) * n * h * hd / C);
  } else if (m.window == 0) {
    // Keys and values around the ring: C-1 hops forward, 2C-1 backward (the gradients' last hop home).
    const double kv = 2.0 * n * h_kv * hd;
    for (int r = 0; r < C; ++r) add(r, (r + 1) % C, (forwards * (C - 1) + (2.0 * C - 1)) * kv);
  } else {
    // The halo: rank r-d sends rank r its last min(n, W-1-(d-1) n) positions' keys and values,
    // forward and again in backward, and gets their gradients back.
    const double kv = 2.0 * h_kv * hd;
    for (int r = 0; r < C; ++r)
      for (int d = 1; d <= r; ++d) {
        const double positions = std::min(n, static_cast<double>(m.window - 1) - (d - 1) * n);
        if (positions <= 0) break;
        add(r - d, r, (forwards + 1.0) * positions * kv);
        add(r, r - d, positions * kv);
      }
  }
  if (stage == cfg.parallel.pipeline - 1) t.loss_sums = 2.0 * sizeof(double) * t.micro_batches;
  return t;
}

double context_bytes_counted(const Config& cfg, const ModelShape& shape, std::int64_t rows) {
  double total = 0;
  for (int stage = 0; stage < cfg.parallel.pipeline; ++stage) {
    const ContextTraffic t = context_traffic(cfg, shape, stage, rows);
    for (int r = 0; r < t.ranks && t.ranks > 1; ++r) total += t.counted(r);
  }
  return total * cfg.parallel.data * cfg.parallel.tensor;
}

std::string describe_context_traffic(const Config& cfg, const ModelShape& shape, std::int64_t rows) {
  if (!is_transformer(cfg.model.kind) || cfg.parallel.spatial < 2) return {};
  // The rank that sends the most, over every stage, and the one that sends the least.
  ContextTraffic busiest;
  double most = -1, least = -1;
  int most_rank = 0, least_rank = 0;
  for (int stage = 0; stage < cfg.parallel.pipeline; ++stage) {
    const ContextTraffic t = context_traffic(cfg, shape, stage, rows);
    for (int r = 0; r < t.ranks; ++r) {
      const double s = t.sent(r);
      if (s > most) most = s, most_rank = r, busiest = t;
      if (least < 0 || s < least) least = s, least_rank = r;
    }
  }
  const bool ring = cfg.parallel.context_comm == ContextComm::ring;
  const std::string how = !ring ? "all_to_all"
                          : cfg.model.window > 0 ? fmt::format("ring, the halo of window {}", cfg.model.window)
                                                 : "ring";
  const std::string who = most == least ? "each rank" : fmt::format("context rank {}", most_rank);
  const std::string spread =
      most == least ? "" : fmt::format(" (the most; context rank {}: {:.3f} MB)", least_rank, least / 1e6);
  return fmt::format("context group (parallel.spatial = {}, {}): {} sends {:.3f} MB per step to the other ranks of "
                     "its group{} ({} blocks x {} micro-batch(es) of {} samples, forward + backward{}; "
                     "src/train/context_traffic.hpp); all ranks hand {:.0f} bytes per step to their context "
                     "groups' communication (own parts and the loss's sums included: summary.json's "
                     "comm.bytes_per_step_by_group.spatial)",
                     cfg.parallel.spatial, how, who, most / 1e6, spread, busiest.blocks, busiest.micro_batches,
                     busiest.samples, cfg.train.recompute ? " + the recomputed forward" : "",
                     context_bytes_counted(cfg, shape, rows));
}

}  // namespace tessera
