#include "io/mpi_check.hpp"

#include <stdexcept>

#include <fmt/format.h>

namespace tessera::io {

void mpi_fail(int code, const char* expr, const char* file, int line) {
  char text[MPI_MAX_ERROR_STRING] = {};
  int length = 0;
  MPI_Error_string(code, text, &length);
  throw std::runtime_error(fmt::format("MPI call {} failed at {}:{}: {}", expr, file, line, text));
}

}  // namespace tessera::io
