// The trainer's "threads:" line: the setup this process really has (Kokkos's host space, the
// BLAS's threads as set), and the warning for OpenMP threads that would spin against OpenBLAS's
// own pool, given in every case where it applies and in none where it does not.
#include <gtest/gtest.h>

#include <Kokkos_Core.hpp>
#include <string>

#include "blas/gemm.hpp"
#include "train/threads.hpp"

namespace {

using tessera::ThreadSetup;
using Model = tessera::blas::BlasThreading::Model;

ThreadSetup setup(const std::string& space, int threads, Model model, int blas_threads,
                  const std::string& policy) {
  return {space, threads, {"OpenBLAS 0.3.21 test", model, blas_threads}, policy};
}

bool warns(const ThreadSetup& s) { return describe(s).find("warning") != std::string::npos; }

TEST(Threads, WarnsWhereOpenMpSpinsAgainstOpenBlasThreads) {
  for (const char* policy : {"", "active", "ACTIVE", "bogus"}) {
    const ThreadSetup s = setup("OpenMP", 2, Model::pthreads, 2, policy);
    EXPECT_TRUE(spins_against_blas(s)) << policy;
    EXPECT_TRUE(warns(s)) << policy;
    EXPECT_NE(describe(s).find("OMP_WAIT_POLICY=passive"), std::string::npos) << describe(s);
  }
}

TEST(Threads, NoWarningWhereNothingSpinsAgainstTheBlas) {
  const ThreadSetup quiet[] = {
      setup("OpenMP", 2, Model::pthreads, 2, "passive"),
      setup("OpenMP", 2, Model::pthreads, 2, "PASSIVE"),
      setup("OpenMP", 1, Model::pthreads, 2, ""),      // one Kokkos thread: nothing spins
      setup("OpenMP", 2, Model::pthreads, 1, ""),      // a single-threaded BLAS has no pool
      setup("OpenMP", 2, Model::openmp, 2, ""),        // one OpenMP pool for both
      setup("OpenMP", 2, Model::sequential, 2, ""),
      setup("Serial", 1, Model::pthreads, 2, ""),
  };
  for (const ThreadSetup& s : quiet) {
    EXPECT_FALSE(spins_against_blas(s)) << describe(s);
    EXPECT_FALSE(warns(s)) << describe(s);
  }
}

TEST(Threads, TheLineNamesEveryPart) {
  const std::string line = describe(setup("OpenMP", 2, Model::openmp, 3, ""));
  EXPECT_EQ(line.rfind("threads: Kokkos OpenMP 2 per rank; BLAS 3 threads (OpenMP) per rank", 0), 0u) << line;
  EXPECT_NE(line.find("[OpenBLAS 0.3.21 test]"), std::string::npos) << line;
  EXPECT_NE(line.find("OMP_WAIT_POLICY unset"), std::string::npos) << line;
}

TEST(Threads, ThisProcessReportsWhatWasSet) {
  const tessera::blas::BlasThreading before = tessera::blas::blas_threading();
  for (int n : {1, 2}) {
    tessera::blas::set_threads(n);
    const ThreadSetup s = tessera::current_thread_setup();
    EXPECT_EQ(s.host_space, Kokkos::DefaultHostExecutionSpace::name());
    EXPECT_GE(s.host_threads, 1);
    EXPECT_FALSE(s.blas.config.empty());
    // A sequential OpenBLAS stays at 1 whatever it is told.
    EXPECT_EQ(s.blas.threads, s.blas.model == Model::sequential ? 1 : n);
  }
  tessera::blas::set_threads(before.threads);
}

}  // namespace
