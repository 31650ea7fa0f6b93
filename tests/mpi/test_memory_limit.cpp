// run.memory_limit_mb after the first step (train::check_memory_limit): the peak every rank
// measured through the allocation counters (core/memory.hpp), not an estimate, is compared with
// the limit; over it, every rank throws the same one-line InputError naming the rank that held
// the most and what it held. Real Kokkos allocations are counted; on 1, 2 and 4 ranks.
#include <gtest/gtest.h>

#include <Kokkos_Core.hpp>
#include <string>
#include <vector>

#include "comm/communicator.hpp"
#include "core/config.hpp"
#include "core/memory.hpp"
#include "kernels/views.hpp"
#include "mpi_test_util.hpp"
#include "train/memory_estimate.hpp"

namespace {

using namespace tessera;
using tessera::test::expect_input_error;
using tessera::test::world_rank;
using tessera::test::world_size;

TEST(MemoryLimit, TheMeasuredPeakOfAnyRankStopsTheRun) {
  mem::install_tracking();
  const Communicator comm(MPI_COMM_WORLD, GridShape{world_size(), 1, 1, 1});
  // The last rank holds 8 MB of activations more than it held before.
  const int big = world_size() - 1;
  const bool is_big = world_rank() == big;
  Vector<float> act(mem::label(mem::Category::act, "test::activations"), is_big ? 2'000'000 : 1);
  Kokkos::fence();
  EXPECT_GE(mem::current(mem::Category::act), is_big ? std::size_t{8'000'000} : std::size_t{4});
  // peaks[0]: the most any other rank held at once, peaks[1]: the last rank's.
  double peaks[2] = {is_big ? 0.0 : double(mem::peak_total()), is_big ? double(mem::peak_total()) : 0.0};
  comm.allreduce_max(peaks, 2, Group::world);
  ASSERT_GT(peaks[1], peaks[0] + 2e6);

  Config cfg;
  cfg.run.memory_limit_mb = 0.0;  // no limit
  EXPECT_NO_THROW(check_memory_limit(cfg, comm));
  cfg.run.memory_limit_mb = peaks[1] / 1e6 + 0.5;  // above every rank's peak
  EXPECT_NO_THROW(check_memory_limit(cfg, comm));
  cfg.run.memory_limit_mb = (peaks[0] + peaks[1]) / 2e6;  // below the last rank's only: every rank stops
  expect_input_error([&] { check_memory_limit(cfg, comm); },
                     {"run.memory_limit_mb = ", "rank " + std::to_string(big) + " held ",
                      "at its peak in the first step (measured"});
}

}  // namespace
