#pragma once
// The threads inside one rank: Kokkos's host execution space (Serial, or OpenMP with
// OMP_NUM_THREADS threads) and the BLAS's own. They take turns on the same cores, kernel after
// GEMM after kernel. An OpenMP runtime whose threads spin while they wait (OMP_WAIT_POLICY
// unset or active) keeps the cores busy while OpenBLAS's own threads want them: measured on the
// GPT, 1 rank x 2 threads ran at half the speed of OMP_WAIT_POLICY=passive
// (bench/gpt_threads.sh, docs/performance.md). The trainer logs the setup and warns of that case.
#include <string>

#include "blas/gemm.hpp"

namespace tessera {

struct ThreadSetup {
  std::string host_space;       ///< Kokkos::DefaultHostExecutionSpace::name()
  int host_threads;             ///< its concurrency
  blas::BlasThreading blas;     ///< what the BLAS reports
  std::string omp_wait_policy;  ///< the environment's OMP_WAIT_POLICY ("" when unset)
};

/// \brief This process's setup (after Kokkos is initialized and the BLAS threads are set).
ThreadSetup current_thread_setup();

/// \brief True when OpenMP threads of Kokkos would spin against a BLAS with its own threads:
/// an OpenMP host space with more than one thread, a multi-threaded BLAS with its own pool, and
/// OMP_WAIT_POLICY other than passive.
bool spins_against_blas(const ThreadSetup& s);

/// \brief One log line ("threads: ..."), with the warning and its remedy where
/// spins_against_blas(s).
std::string describe(const ThreadSetup& s);

}  // namespace tessera
