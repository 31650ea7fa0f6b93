#pragma once
// The bytes a transformer's context parallelism (parallel.spatial = C > 1, model.kind "gpt" or
// "llama") moves between the ranks of a context group in one training step, from the deck alone:
// what `tessera check` and `tessera plan` print (docs/performance.md, "Choosing a layout").
//
// Per block and micro-batch of B samples, with n = T/C positions per rank, h the query heads and
// h_kv the key/value heads of a tensor rank (model.heads / tp and model.kv_heads / tp; the gpt's
// h_kv = h), hd = model.width / model.heads, elements of 4 bytes (fp32):
//   all_to_all (nn/context_parallel.cpp): forward regroups q, k and v (the llama's k and v already
//     repeated to all h heads) in one all-to-all and returns y in another: 4 B n h hd elements
//     handed to them; backward dy, then dq, dk, dv: as many. An all-to-all hands 1/C of its buffer
//     to each rank of the group, itself included, so (C-1)/C of it crosses: rank r sends
//     B n h hd / C elements to each other rank q, 4 times forward and 4 times backward.
//   ring (nn/context_ring.cpp): forward, C-1 hops of the rank's keys and values to the next rank
//     (r+1 mod C), 2 B n h_kv hd each; backward, C-1 hops of keys and values and C of their
//     gradient accumulators dK, dV (the last brings them home): (2C-1) 2 B n h_kv hd.
//   ring with model.window = W: a halo instead: forward, rank r-d (d >= 1) sends rank r the keys and
//     values of its last min(n, W-1-(d-1) n) positions where that is positive, 2 B h_kv hd per
//     position; backward sends them again (nn/context_ring.cpp keeps no halo between forward and
//     backward) and rank r returns their gradients in the same messages reversed. Rank r receives
//     min(W-1, r n) positions twice and sends as many gradients back.
// train.recompute repeats the forward's messages once more in backward. Every block of the rank's pipeline
// stage (all its chunks), every micro-batch of the step. Besides: the loss's two sums (doubles)
// over the group, once per micro-batch on the last stage.
// The rough forms per rank and layer, N = T and hd left out: ring about 2 N h_kv (each way),
// Ulysses about (N/C)(2h + 2h_kv) (each way; here 4 (N/C) h, k and v being regrouped after their
// repetition), a window's halo 2 W h_kv, independent of T and C once W-1 < T/C.
#include <cstdint>
#include <string>
#include <vector>

#include "core/config.hpp"
#include "train/model.hpp"

namespace tessera {

/// \brief One context group's bytes per training step (forward, backward and any recomputed
/// forward; every block of one pipeline stage; every micro-batch).
struct ContextTraffic {
  int ranks = 1;              ///< C: the group's context ranks
  int blocks = 0;             ///< transformer blocks on the stage
  std::int64_t samples = 0;   ///< B: rows of a micro-batch
  int micro_batches = 0;
  /// Bytes context rank `from` hands to context rank `to`, row-major [from * ranks + to]; the
  /// diagonal holds the all-to-all's own part, which never leaves the rank.
  std::vector<double> bytes;
  /// Bytes of the loss's sums each rank hands to the group (the last stage; MPI's allreduce
  /// counts its payload, comm.allreduce = "mpi").
  double loss_sums = 0;

  double between(int from, int to) const { return bytes[static_cast<std::size_t>(from * ranks + to)]; }
  /// What context rank r sends to the other ranks of its group.
  double sent(int r) const;
  /// What Communicator::counters()[Group::spatial] counts for context rank r: what it sends, its
  /// own part of each all-to-all and the loss's sums.
  double counted(int r) const;
};

/// \brief The traffic of a context group of pipeline stage `stage` for cfg (layout resolved) on
/// data of `shape`, with micro-batches of `rows` samples (0: the deck's nominal micro-batch).
/// Empty (ranks 1, no bytes) unless a transformer has parallel.spatial > 1. Pure: no MPI.
ContextTraffic context_traffic(const Config& cfg, const ModelShape& shape, int stage, std::int64_t rows = 0);

/// \brief What every rank of the layout hands to its context group per step, summed over the
/// ranks: what Communicator::counters() count under Group::spatial, and so what summary.json
/// reports as comm.bytes_per_step_by_group.spatial. 0 without context parallelism.
double context_bytes_counted(const Config& cfg, const ModelShape& shape, std::int64_t rows = 0);

/// \brief One line for `tessera check` and `tessera plan`: the most any rank of any stage sends
/// to its context group per step (and the least, where ranks differ), what it is made of, and
/// context_bytes_counted(). Empty where there is no context parallelism.
std::string describe_context_traffic(const Config& cfg, const ModelShape& shape, std::int64_t rows = 0);

}  // namespace tessera
