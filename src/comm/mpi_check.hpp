#pragma once
// MPI_CHECK(call): every MPI return code is checked; a failure names the call, file and line.
#include <mpi.h>

#include <stdexcept>
#include <string>

namespace tessera::detail {
[[noreturn]] inline void mpi_failed(int code, const char* call, const char* file, int line) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(code, text, &len);
  throw std::runtime_error(std::string(file) + ":" + std::to_string(line) + ": " + call +
                           " failed: " + std::string(text, static_cast<std::size_t>(len)));
}
}  // namespace tessera::detail

#define MPI_CHECK(call)                                                          \
  do {                                                                           \
    const int mpi_check_code_ = (call);                                          \
    if (mpi_check_code_ != MPI_SUCCESS)                                          \
      ::tessera::detail::mpi_failed(mpi_check_code_, #call, __FILE__, __LINE__); \
  } while (0)
