#pragma once
// `tessera diff A B`: two checkpoints compared tensor by tensor, whatever layouts wrote them.
#include <optional>
#include <string>

namespace tessera::cli {

struct DiffArgs {
  std::string a, b;                 ///< checkpoint files
  std::optional<double> tolerance;  ///< --tolerance REL: exit 1 when exceeded or the sets differ
  std::string csv;                  ///< --csv PATH; empty: table only
  bool model_only = false;          ///< --model-only: /model tensors only, no optimizer state
};

/// Exit code of `tessera diff` when --tolerance is given and a tensor exceeds it, or a tensor is
/// in one file only, or its shapes differ.
inline constexpr int kDiffExitDiffers = 1;

/// \brief Compares every tensor under /model and /optimizer (only /model with model_only) of
/// checkpoints a and b. Must be called on every rank of MPI_COMM_WORLD: each tensor's rows are
/// split among the ranks, each rank reads its rows of both files collectively, and the maxima are
/// reduced; rank 0 prints the attributes that differ, a table (tensor, shape, max_abs, max_rel,
/// status), a summary line, and writes the CSV. max_rel = max|a-b| / max(max|a|, max|b|, FLT_MIN)
/// per tensor. Returns 0, or kDiffExitDiffers (see there). InputError naming the file when one is
/// missing or not a checkpoint, or the CSV cannot be written.
int diff(const DiffArgs& args);

}  // namespace tessera::cli
