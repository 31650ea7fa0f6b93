// The main of the integration tests (one process that starts `tessera` under mpirun): googletest
// with the exit codes of tests/test_outcome.hpp (skipped tests are reported to ctest as skipped).
#include <gtest/gtest.h>

#include "test_outcome.hpp"

int main(int argc, char** argv) {
  const bool hardware_entry = tessera::test::take_hardware_flag(argc, argv);
  testing::InitGoogleTest(&argc, argv);
  return tessera::test::exit_code(tessera::test::outcome(RUN_ALL_TESTS(), hardware_entry, true));
}
