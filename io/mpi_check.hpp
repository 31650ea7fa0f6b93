#pragma once
// Checking MPI return codes in io/ (the communicator layer in src/ has its own).
#include <mpi.h>

namespace tessera::io {

/// \brief Throws std::runtime_error naming expr, file, line and MPI's error string.
[[noreturn]] void mpi_fail(int code, const char* expr, const char* file, int line);

}  // namespace tessera::io

/// Checks an MPI call's return code.
#define TESSERA_IO_MPI(expr)                                                   \
  do {                                                                         \
    int tessera_mpi_code_ = (expr);                                            \
    if (tessera_mpi_code_ != MPI_SUCCESS)                                      \
      ::tessera::io::mpi_fail(tessera_mpi_code_, #expr, __FILE__, __LINE__);   \
  } while (false)
