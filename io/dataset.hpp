#pragma once
// Reading a split of an HDF5 dataset (DESIGN.md "Datasets") with parallel HDF5: each rank reads
// the samples its batches need, collectively, or serves them from an in-memory copy. io::Split is
// what the trainer reads; SupervisedSplit holds inputs with labels or targets, TokenSplit
// (io/token_dataset.hpp) windows of tokens; open_split picks by the file's layout.
#include <mpi.h>

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace tessera::io {

/// A block of every sample's grid: the second-to-last axis of inputs and targets (H of
/// [N, C, H, W]) cut into `parts` equal blocks of rows, of which a rank reads block `part`
/// (parallel.spatial). parts = 1: whole samples.
struct RowBlock {
  int parts = 1, part = 0;
  /// A token window's positions as two chunks of 2 parts: the part-th and the (2 parts - 1 -
  /// part)-th (context_head_tail), not one block.
  bool head_tail = false;
};

/// What a split holds, as validated when it was opened.
struct SplitInfo {
  std::string file, split;
  std::int64_t samples = 0;
  std::vector<std::int64_t> sample_shape;  ///< inputs shape without N
  std::int64_t features = 0;               ///< product of sample_shape
  bool has_labels = false;                 ///< labels [N] integer; otherwise targets [N,...] float32
  std::int64_t classes = 0;                ///< labels: attribute "classes", else max label + 1
  std::int64_t target_width = 0;           ///< targets: product of shape without N
  std::vector<std::int64_t> target_shape;  ///< targets: shape without N
  RowBlock block;                          ///< the rows of each sample a rank reads
  std::int64_t local_features = 0;         ///< values per sample read() returns (the block's)
  std::int64_t local_target_width = 0;     ///< targets per sample read() returns (the block's)
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
  /// \param inputs indices.size() x local_features floats, already x*scale + offset
  /// \param labels indices.size() x label_width ints if info().has_labels, else may be null
  /// \param targets indices.size() x local_target_width floats if !info().has_labels, else may be null
  /// An index outside [0, samples) is a bug in the caller: std::out_of_range on that rank.
  virtual void read(std::span<const std::int64_t> indices, float* inputs, std::int32_t* labels,
                    float* targets) = 0;
};

/// No limit on the bytes a split's cache may take.
inline constexpr std::uint64_t kNoCacheLimit = ~std::uint64_t{0};

/// \brief One split (`/train`, `/test`) of a supervised dataset file, open for reading rows.
class SupervisedSplit final : public Split {
 public:
  /// \brief Opens group `split` of the HDF5 file at path and validates it: `inputs` uint8 or
  /// float32 of rank >= 2; exactly one of `labels` (integer, rank 1) and `targets` (float32,
  /// rank >= 1); the same N > 0 rows in each; every label in [0, classes). Must be called on every
  /// rank of comm; on bad input every rank throws the same InputError naming file and dataset.
  /// Any HDF5 failure (a damaged or truncated file) is such an InputError, also in read(), where
  /// every float read is checked to be finite and every label to be in range.
  /// \param cache read the whole split into this rank's memory now (collectively); read() then
  /// serves rows from memory.
  /// \param cache_limit the most bytes the cache may take on this rank; a larger split is an
  /// InputError that suggests data.cache = false.
  /// \param block with parts > 1, read only this block of rows of each sample (inputs and
  /// targets of rank >= 3 whose second-to-last extent parts divides, else an InputError naming
  /// the dataset; labels are refused: a block has no class of its own).
  SupervisedSplit(MPI_Comm comm, const std::string& path, const std::string& split, bool cache,
                  std::uint64_t cache_limit = kNoCacheLimit, RowBlock block = {});
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

/// \brief The split `split` of the dataset at path, opened for reading: a TokenSplit (windows of
/// `context` tokens, io/token_dataset.hpp) where the group holds `tokens`, else a SupervisedSplit
/// (`context` unused). Either is cached in this rank's memory when `cache`. Must be called on
/// every rank of comm; on bad input every rank throws the same InputError naming the file and the
/// group or dataset: a missing file or group, or a group with neither `inputs` nor `tokens`, says
/// what each layout expects.
/// A block (RowBlock, parts > 1) of a supervised split cuts each sample's rows; of a language split
/// each window's positions (context divisible by the parts).
std::unique_ptr<Split> open_split(MPI_Comm comm, const std::string& path, const std::string& split,
                                  std::int64_t context, bool cache,
                                  std::uint64_t cache_limit = kNoCacheLimit, RowBlock block = {});

}  // namespace tessera::io
