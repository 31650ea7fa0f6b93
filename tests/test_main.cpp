// One test main for every test executable, single- or multi-rank.
// Starts MPI and Kokkos, lets only rank 0 print googletest's output, and makes the exit code the
// same on every rank: the worst outcome of any rank (failed, then skipped, then passed), as
// tests/test_outcome.hpp maps it for ctest. --hang-rank N makes rank N wait in a loop so a
// debugger can attach (set the variable `attached` to 1 to continue). --gtest_shuffle shuffles
// alike on every rank (rank 0's seed).
#include <gtest/gtest.h>
#include <mpi.h>
#include <unistd.h>

#include <Kokkos_Core.hpp>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>

#include "test_outcome.hpp"

int main(int argc, char** argv) {
  setenv("OMPI_MCA_fbtl_posix_read_datasieving", "0", 0);  // as src/main.cpp: ompi#10546
  MPI_Init(&argc, &argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::strcmp(argv[i], "--hang-rank") == 0 && std::atoi(argv[i + 1]) == rank) {
      volatile int attached = 0;
      std::fprintf(stderr, "rank %d waiting for a debugger: gdb -p %d\n", rank, getpid());
      while (!attached) sleep(1);
    }
  }
  const bool hardware_entry = tessera::test::take_hardware_flag(argc, argv);
  int result = 0;
  {
    Kokkos::ScopeGuard kokkos(argc, argv);
    ::testing::InitGoogleTest(&argc, argv);
    // Every rank must run the tests in one order (they meet in collectives), but googletest
    // seeds --gtest_shuffle from each process's clock: take rank 0's seed everywhere.
    int seed = GTEST_FLAG_GET(random_seed);
    if (rank == 0 && seed == 0) seed = static_cast<int>(std::time(nullptr) % 99999) + 1;
    MPI_Bcast(&seed, 1, MPI_INT, 0, MPI_COMM_WORLD);
    GTEST_FLAG_SET(random_seed, seed);
    if (rank != 0) {
      auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
      delete listeners.Release(listeners.default_result_printer());
    }
    result = static_cast<int>(tessera::test::outcome(RUN_ALL_TESTS(), hardware_entry, rank == 0));
  }
  int worst = 0;
  MPI_Allreduce(&result, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (worst > result && rank == 0)
    std::fprintf(stderr, "another rank %s\n", worst == static_cast<int>(tessera::test::Outcome::failed) ? "failed" : "skipped a test");
  MPI_Finalize();
  return tessera::test::exit_code(static_cast<tessera::test::Outcome>(worst));
}
