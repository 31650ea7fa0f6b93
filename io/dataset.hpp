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
};

/// \brief One split (`/train`, `/test`) of a supervised dataset file, open for reading rows.
class SupervisedSplit {
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

  const SplitInfo& info() const;

  /// \brief Reads the samples `indices` (global, any order, duplicates allowed, possibly none)
  /// into host memory; row i of each output is sample indices[i].
  /// Must be called on every rank of comm the same number of times (a collective read).
  /// \param inputs indices.size() x features floats, already x*scale + offset
  /// \param labels indices.size() ints if info().has_labels, else may be null
  /// \param targets indices.size() x target_width floats if !info().has_labels, else may be null
  /// An index outside [0, samples) is a bug in the caller: std::out_of_range on that rank.
  void read(std::span<const std::int64_t> indices, float* inputs, std::int32_t* labels,
            float* targets);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tessera::io
