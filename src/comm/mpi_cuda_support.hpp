#pragma once
// Whether the MPI library takes CUDA device pointers, asked of the library itself: Open MPI's
// MPIX_Query_cuda_support() (<mpi-ext.h>), or MPICH's MPIX_GPU_query_support().
#include <string>

namespace tessera {

/// An answer that may be missing: the library has no such query, or no such macro.
enum class Answer { no, yes, unknown };

struct MpiCudaSupport {
  /// The compile-time macro MPIX_CUDA_AWARE_SUPPORT (1: built with CUDA support), unknown where
  /// the header does not define it.
  Answer compile_time = Answer::unknown;
  /// The run-time query: what the library that is actually loaded says now.
  Answer run_time = Answer::unknown;
  /// First line of MPI_Get_library_version ("Open MPI v4.1.4, package: Debian OpenMPI, ...").
  std::string library;
  /// One line: which query was asked and what it said.
  std::string why;

  /// \brief True only where the run-time query said yes; a library that cannot be asked counts
  /// as not CUDA-aware (comm.backend = "auto" then stages through host memory).
  bool cuda_aware() const { return run_time == Answer::yes; }
};

/// \brief Asks the MPI library (after MPI_Init) whether it is CUDA-aware. Local: no
/// communication. Every rank of a job loads the same library, so every rank gets the same answer.
MpiCudaSupport detect_mpi_cuda_support();

/// "yes", "no", "unknown".
const char* to_string(Answer a);

}  // namespace tessera
