#pragma once
// Reading a split of a language dataset (DESIGN.md "Datasets": `/<split>/tokens` [N] and the root
// attribute `vocab_size`) as windows of tokens with next-token labels, with parallel HDF5.
#include <mpi.h>

#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "io/dataset.hpp"

namespace tessera::io {

/// \brief One split of a language dataset, read as windows of `context` tokens.
///
/// Sample s, for s in [0, samples) with samples = (N - 1) / context, is the window of tokens
/// [s*context, s*context + context); its labels are the tokens [s*context + 1, s*context +
/// context + 1), the next token at every position. The last (N - 1) % context tokens after the
/// last window's label never start a window. info(): sample_shape {context}, features = context,
/// has_labels, classes = vocab_size, label_width = context, target_width 0, scale 1, offset 0.
class TokenSplit final : public Split {
 public:
  /// \brief Opens group `split` of the HDF5 file at path and validates it: `tokens` a 1-D dataset
  /// of any integer type (uint8, uint16 and int32 in DESIGN.md), the root attribute `vocab_size`
  /// an integer in [1, 2^24] (token ids travel as exact float32 inputs), at least context + 1
  /// tokens, and every token in [0, vocab_size). Every token is checked here, also when not
  /// cached (each rank reads and checks a share of the file, in chunks), so a bad file fails at
  /// open, never in the middle of training. Must be called on every rank of comm; on bad input
  /// every rank throws the same InputError naming the file and the dataset (and, for a bad
  /// token, its position and value).
  /// \param context tokens per sample, >= 1 (std::invalid_argument otherwise)
  /// \param cache read all the tokens into this rank's memory now (collectively, N times the
  /// stored element size); read() then serves windows from memory. Otherwise read() reads the
  /// windows it needs from the file, collectively.
  /// \param cache_limit the most bytes the cache may take on this rank (as SupervisedSplit)
  /// \param block with parts > 1, each window's positions cut into `parts` equal blocks of which
  /// read() returns block `part` (a transformer's context parallelism, parallel.spatial): inputs
  /// and labels of context / parts positions per sample; context must be a multiple of parts.
  TokenSplit(MPI_Comm comm, const std::string& path, const std::string& split, std::int64_t context,
             bool cache, std::uint64_t cache_limit = kNoCacheLimit, RowBlock block = {});
  ~TokenSplit() override;
  TokenSplit(TokenSplit&&) noexcept;
  TokenSplit& operator=(TokenSplit&&) noexcept;

  const SplitInfo& info() const override;
  /// \brief Split::read: inputs row i = the window's tokens as floats (exact integers), labels
  /// row i = the next tokens (label_width = context each, or the block's positions); targets is not used. Uncached, one
  /// collective read per call of the union of the windows (context + 1 tokens each; windows that
  /// touch or overlap are merged, duplicates read once).
  void read(std::span<const std::int64_t> indices, float* inputs, std::int32_t* labels,
            float* targets) override;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tessera::io
