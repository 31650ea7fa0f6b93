#pragma once
// Reading a supervised split of an HDF5 dataset (DESIGN.md "Datasets") with parallel HDF5: each
// rank reads the rows its batches need, collectively, or serves them from an in-memory copy.
#include <mpi.h>

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace tessera::io {

/// What a split holds, as validated when it was opened.
struct SplitInfo {
  std::string file, split;
  std::int64_t samples = 0;
  std::vector<std::int64_t> sample_shape;  ///< inputs shape without N
  std::int64_t features = 0;               ///< product of sample_shape
  bool has_labels = false;                 ///< labels [N] integer; otherwise targets [N,...] float32
  std::int64_t classes = 0;                ///< labels: attribute "classes", else max label + 1
  std::int64_t target_width = 0;           ///< targets: product of shape without N
  float scale = 1.0f, offset = 0.0f;       ///< inputs map to x*scale + offset
  std::int64_t label_width = 1;            ///< labels per sample (a token window: one per position)
};

/// \brief One split of a dataset, open for reading samples by index.
class Split {
 public:
  virtual ~Split() = default;
  virtual const SplitInfo& info() const = 0;
  /// \brief Reads the samples `indices` (global, any order, duplicates allowed, possibly none)
  /// into host memory; row i of each output is sample indices[i]. Must be called on every rank
  /// of the split's communicator the same number of times (a collective read).
  /// \param inputs indices.size() x features floats, already x*scale + offset
  /// \param labels indices.size() x label_width ints if info().has_labels, else may be null
  /// \param targets indices.size() x target_width floats if !info().has_labels, else may be null
  /// An index outside [0, samples) is a bug in the caller: std::out_of_range on that rank.
  virtual void read(std::span<const std::int64_t> indices, float* inputs, std::int32_t* labels,
                    float* targets) = 0;
};

/// \brief One split (`/train`, `/test`) of a supervised dataset file, open for reading rows.
class SupervisedSplit final : public Split {
 public:
  /// \brief Opens group `split` of the HDF5 file at path and validates it: `inputs` uint8 or
  /// float32 of rank >= 2; exactly one of `labels` (integer, rank 1) and `targets` (float32,
  /// rank >= 1); the same N > 0 rows in each; every label in [0, classes). Must be called on every
  /// rank of comm; on bad input every rank throws the same InputError naming file and dataset.
  /// \param cache read the whole split into this rank's memory now (collectively); read() then
  /// serves rows from memory.
  SupervisedSplit(MPI_Comm comm, const std::string& path, const std::string& split, bool cache);
  ~SupervisedSplit();
  SupervisedSplit(SupervisedSplit&&) noexcept;
  SupervisedSplit& operator=(SupervisedSplit&&) noexcept;

  const SplitInfo& info() const override;
  void read(std::span<const std::int64_t> indices, float* inputs, std::int32_t* labels,
            float* targets) override;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// \brief One split of a language dataset (DESIGN.md): `/<split>/tokens` [N] of integers and the
/// root attribute `vocab_size`. Sample s is the window of `context` tokens starting at token
/// s * context; its labels are the next token at each position (the window shifted by one), so
/// samples = (N - 1) / context. The tokens are read once per rank into memory (collectively) and
/// validated then: every token in [0, vocab_size).
class TokenSplit final : public Split {
 public:
  /// Must be called on every rank of comm; on bad input every rank throws the same InputError
  /// naming file and dataset.
  TokenSplit(MPI_Comm comm, const std::string& path, const std::string& split, std::int64_t context);
  const SplitInfo& info() const override { return info_; }
  /// Inputs: the window's token ids as floats; labels: the next tokens. Local (from memory).
  void read(std::span<const std::int64_t> indices, float* inputs, std::int32_t* labels,
            float* targets) override;

 private:
  SplitInfo info_;
  std::vector<std::int32_t> tokens_;
};

/// \brief The split `split` of the dataset at path: a TokenSplit (windows of `context` tokens)
/// where the group holds `tokens`, else a SupervisedSplit (cached in memory when `cache`).
/// Collective over comm.
std::unique_ptr<Split> open_split(MPI_Comm comm, const std::string& path, const std::string& split,
                                  std::int64_t context, bool cache);

}  // namespace tessera::io
