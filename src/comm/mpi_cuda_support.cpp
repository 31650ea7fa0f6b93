#include "comm/mpi_cuda_support.hpp"

#include <fmt/format.h>
#include <mpi.h>

// Open MPI ships its extensions (the cuda one among them) in <mpi-ext.h>; MPICH declares its
// MPIX_ functions in <mpi.h>.
#if defined(OPEN_MPI) && __has_include(<mpi-ext.h>)
#include <mpi-ext.h>
#endif

#include "comm/mpi_check.hpp"

namespace tessera {

const char* to_string(Answer a) {
  switch (a) {
    case Answer::no: return "no";
    case Answer::yes: return "yes";
    case Answer::unknown: return "unknown";
  }
  return "?";
}

namespace {

std::string library_version() {
  char text[MPI_MAX_LIBRARY_VERSION_STRING];
  int len = 0;
  MPI_CHECK(MPI_Get_library_version(text, &len));
  std::string s(text, static_cast<std::size_t>(len));
  s = s.substr(0, s.find_first_of("\r\n"));
  while (!s.empty() && (s.back() == ' ' || s.back() == '\0')) s.pop_back();
  return s;
}

}  // namespace

MpiCudaSupport detect_mpi_cuda_support() {
  MpiCudaSupport s;
  s.library = library_version();
#if defined(MPIX_CUDA_AWARE_SUPPORT)
  // Open MPI: the macro says how the headers were configured, the query what the loaded
  // library can do (it is declared whatever the macro's value).
  s.compile_time = MPIX_CUDA_AWARE_SUPPORT ? Answer::yes : Answer::no;
  const int query = MPIX_Query_cuda_support();
  s.run_time = query == 1 ? Answer::yes : Answer::no;
  s.why = fmt::format("MPIX_Query_cuda_support() = {}, MPIX_CUDA_AWARE_SUPPORT = {}", query,
                      static_cast<int>(MPIX_CUDA_AWARE_SUPPORT));
#elif defined(MPIX_GPU_SUPPORT_CUDA)
  // MPICH 4: one query for every GPU runtime.
  int supported = 0;
  MPI_CHECK(MPIX_GPU_query_support(MPIX_GPU_SUPPORT_CUDA, &supported));
  s.run_time = supported ? Answer::yes : Answer::no;
  s.why = fmt::format("MPIX_GPU_query_support(MPIX_GPU_SUPPORT_CUDA) = {}", supported);
#else
  s.why = "this MPI library has no CUDA-support query (neither MPIX_Query_cuda_support nor "
          "MPIX_GPU_query_support)";
#endif
  return s;
}

}  // namespace tessera
