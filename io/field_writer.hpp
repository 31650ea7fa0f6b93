#pragma once
// A parallel writer of fields [N, C, H, W] (float32) whose rows are split over the ranks of a
// communicator (spatial parallelism): each rank writes its block of rows of each sample as one
// hyperslab, collectively through MPI-IO. `tessera prepare darcy` writes its dataset with it.
#include <mpi.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "io/attr.hpp"

namespace tessera::io {

class FieldWriter {
 public:
  /// \brief Creates (truncates) path on every rank of comm (collective); its directory must exist.
  FieldWriter(MPI_Comm comm, const std::string& path);
  ~FieldWriter();
  FieldWriter(const FieldWriter&) = delete;
  FieldWriter& operator=(const FieldWriter&) = delete;

  /// \brief Creates a float32 dataset of shape [N, C, H, W] (parent groups as needed), its storage
  /// allocated at once. Collective, with the same arguments on every rank.
  void create(const std::string& dataset, const std::vector<std::uint64_t>& shape);
  /// \brief Writes samples [first, first + count), every channel, rows [row0, row0 + rows) of
  /// every column: data holds count x C x rows x W values. Collective: every rank calls it, with
  /// the same first and count and its own rows (possibly none).
  void write_rows(const std::string& dataset, std::uint64_t first, std::uint64_t count, std::uint64_t row0,
                  std::uint64_t rows, const float* data);
  /// \brief Writes an attribute on the group or dataset at `object`; collective, the same value
  /// on every rank.
  void write_attr(const std::string& object, const std::string& name, const Attr& value);
  void write_float_attr(const std::string& object, const std::string& name, float value);
  /// \brief Closes the file (collective), reporting any failure to flush it.
  void close();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tessera::io
