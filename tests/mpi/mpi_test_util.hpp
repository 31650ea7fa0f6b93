#pragma once
// Helpers shared by the multi-rank tests.
#include <gtest/gtest.h>
#include <mpi.h>

#include <functional>
#include <string>
#include <vector>

#include "core/error.hpp"

namespace tessera::test {

inline int world_rank() {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank;
}

inline int world_size() {
  int size = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  return size;
}

/// Asserts that f throws an InputError on this rank containing every one of parts.
inline void expect_input_error(const std::function<void()>& f, const std::vector<std::string>& parts) {
  try {
    f();
    ADD_FAILURE() << "rank " << world_rank() << ": no InputError";
  } catch (const InputError& e) {
    for (const std::string& part : parts) {
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos)
          << "rank " << world_rank() << ": \"" << e.what() << "\" lacks \"" << part << "\"";
    }
  }
}

}  // namespace tessera::test
