#include "train/threads.hpp"

#include <fmt/format.h>

#include <Kokkos_Core.hpp>
#include <algorithm>
#include <cctype>
#include <cstdlib>

namespace tessera {

ThreadSetup current_thread_setup() {
  const char* policy = std::getenv("OMP_WAIT_POLICY");
  return {Kokkos::DefaultHostExecutionSpace::name(),
          static_cast<int>(Kokkos::DefaultHostExecutionSpace().concurrency()), blas::blas_threading(),
          policy != nullptr ? policy : ""};
}

bool spins_against_blas(const ThreadSetup& s) {
  std::string policy = s.omp_wait_policy;
  std::transform(policy.begin(), policy.end(), policy.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s.host_space == "OpenMP" && s.host_threads > 1 &&
         s.blas.model == blas::BlasThreading::Model::pthreads && s.blas.threads > 1 &&
         policy != "passive";
}

std::string describe(const ThreadSetup& s) {
  std::string line = fmt::format("threads: Kokkos {} {} per rank; BLAS {} threads ({}) per rank [{}]; "
                                 "OMP_WAIT_POLICY {}",
                                 s.host_space, s.host_threads, s.blas.threads,
                                 blas::model_name(s.blas.model), s.blas.config,
                                 s.omp_wait_policy.empty() ? "unset" : s.omp_wait_policy);
  if (spins_against_blas(s))
    line += "; warning: Kokkos's OpenMP threads spin between kernels and take the cores from "
            "OpenBLAS's own threads (the GPT ran at half speed so): set OMP_WAIT_POLICY=passive or "
            "use OpenBLAS's OpenMP build";
  return line;
}

}  // namespace tessera
