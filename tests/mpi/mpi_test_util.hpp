#pragma once
// Helpers shared by the multi-rank tests.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdlib>
#include <filesystem>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <system_error>
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

/// \brief A fresh directory with the same path on every rank of MPI_COMM_WORLD (ranks that share
/// a file system see one directory). Rank 0 makes it (mkdtemp under the temporary directory) and
/// broadcasts its path; the destructor waits until every rank is done with it, then rank 0
/// removes it. Construction and destruction are collective: every rank must call both.
class SharedTempDir {
 public:
  explicit SharedTempDir(const std::string& prefix) {
    std::string path;
    if (world_rank() == 0) {
      std::error_code ec;
      std::string pattern = (std::filesystem::temp_directory_path(ec) / (prefix + "-XXXXXX")).string();
      if (!ec && mkdtemp(pattern.data()) != nullptr) path = pattern;
    }
    // Broadcast the path (empty: rank 0 could not make it, and every rank throws).
    int length = static_cast<int>(path.size());
    MPI_Bcast(&length, 1, MPI_INT, 0, MPI_COMM_WORLD);
    path.resize(static_cast<std::size_t>(length));
    MPI_Bcast(path.data(), length, MPI_CHAR, 0, MPI_COMM_WORLD);
    if (path.empty()) throw std::runtime_error("rank 0 could not make a temporary directory " + prefix + "-XXXXXX");
    path_ = path;
  }
  ~SharedTempDir() {
    MPI_Barrier(MPI_COMM_WORLD);  // every rank has closed its files
    if (world_rank() != 0) return;
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
    if (ec) ADD_FAILURE() << "cannot remove " << path_ << ": " << ec.message();
  }
  SharedTempDir(const SharedTempDir&) = delete;
  SharedTempDir& operator=(const SharedTempDir&) = delete;

  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

/// \brief Fixture of a multi-rank test that writes files: each test gets a SharedTempDir of its
/// own (dir(), named after the test), made in SetUp and removed in TearDown on every rank, so no
/// test sees another's files and the tests pass in any order (--gtest_shuffle, --gtest_repeat).
class SharedTempDirTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const ::testing::TestInfo* test = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_.emplace(std::string("tessera-") + test->test_suite_name() + "-" + test->name());
  }
  void TearDown() override { dir_.reset(); }

  /// The test's directory, the same path on every rank.
  const std::string& dir() const { return dir_->path(); }

 private:
  std::optional<SharedTempDir> dir_;
};

}  // namespace tessera::test
