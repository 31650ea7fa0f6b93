#pragma once
// A parallel writer of 1-D token arrays: each rank writes its contiguous share of a dataset as
// one hyperslab, collectively through MPI-IO. `tessera prepare text --tokenizer` writes with it.
#include <mpi.h>

#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "io/attr.hpp"
#include "io/dataset_writer.hpp"

namespace tessera::io {

class TokenWriter {
 public:
  /// \brief Creates (truncates) path on every rank of comm (collective); its directory must exist.
  TokenWriter(MPI_Comm comm, const std::string& path);
  ~TokenWriter();
  TokenWriter(const TokenWriter&) = delete;
  TokenWriter& operator=(const TokenWriter&) = delete;

  /// \brief Creates the 1-D dataset of `length` elements of `type` (uint8, uint16 or int32),
  /// parent groups as needed, and writes elements [first, first + values.size()) from values,
  /// converted to type (each value must fit it). Collective: every rank calls it with the same
  /// dataset, length and type and its own first and values (possibly none); the ranges of the
  /// ranks must not overlap.
  void write(const std::string& dataset, std::uint64_t length, ElementType type, std::uint64_t first,
             std::span<const std::int32_t> values);
  /// \brief Writes an attribute on the group or dataset at `object`; collective, the same value
  /// on every rank.
  void write_attr(const std::string& object, const std::string& name, const Attr& value);
  /// \brief Closes the file (collective), reporting any failure to flush it.
  void close();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tessera::io
