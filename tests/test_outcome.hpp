// What a googletest run means to ctest: one exit code for every test executable's main.
//
//   0   every selected test ran and passed
//   1   a test failed, no test was selected (a filter that matches nothing proves nothing), or a
//       test skipped where skips are failures (below)
//   77  every test that ran passed but some skipped: ctest reports the entry as "Skipped" (each
//       entry has SKIP_RETURN_CODE 77), so a test that never ran is never counted as passed
//
// Skips are failures where TESSERA_REQUIRE_TESTS=1 (tools/test.sh sets it in CI), except in the
// entries that ctest registers for hardware-dependent tests (`NAME.hardware`, which pass
// --hardware-may-skip): in CI every test runs unless it needs hardware this machine may lack
// (docs/testing.md lists those tests and what each needs).
#pragma once

#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

namespace tessera::test {

/// \brief The outcome of this process's tests, ordered so that the worst of several ranks wins.
enum class Outcome : int { passed = 0, skipped = 1, failed = 2 };

/// \brief Removes --hardware-may-skip from argv (before googletest sees it); true if it was there.
inline bool take_hardware_flag(int& argc, char** argv) {
  bool found = false;
  int out = 1;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--hardware-may-skip") == 0) {
      found = true;
      continue;
    }
    argv[out++] = argv[i];
  }
  argc = out;
  argv[argc] = nullptr;
  return found;
}

/// \brief Classifies the finished run; with `report`, prints every skipped test with its reason
/// and, when a skip or an empty selection fails the run, why.
inline Outcome outcome(int gtest_result, bool hardware_entry, bool report) {
  const testing::UnitTest& unit = *testing::UnitTest::GetInstance();
  if (gtest_result != 0 || unit.failed_test_count() > 0) return Outcome::failed;
  if (unit.test_to_run_count() == 0) {
    if (report) std::fprintf(stderr, "tessera-test: no test matched the filter: nothing was checked\n");
    return Outcome::failed;
  }
  int skipped = 0;
  for (int s = 0; s < unit.total_test_suite_count(); ++s) {
    const testing::TestSuite& suite = *unit.GetTestSuite(s);
    for (int t = 0; t < suite.total_test_count(); ++t) {
      const testing::TestInfo& info = *suite.GetTestInfo(t);
      if (!info.should_run() || !info.result()->Skipped()) continue;
      ++skipped;
      if (!report) continue;
      std::string why;
      for (int k = 0; k < info.result()->total_part_count(); ++k) {
        const testing::TestPartResult& part = info.result()->GetTestPartResult(k);
        if (part.skipped()) why = part.message();
      }
      std::fprintf(stderr, "tessera-test: SKIPPED %s.%s: %s\n", suite.name(), info.name(), why.c_str());
    }
  }
  if (skipped == 0) return Outcome::passed;
  const char* required = std::getenv("TESSERA_REQUIRE_TESTS");
  if (!hardware_entry && required != nullptr && std::strcmp(required, "1") == 0) {
    if (report)
      std::fprintf(stderr, "tessera-test: %d test(s) skipped where every test must run (TESSERA_REQUIRE_TESTS=1): "
                           "install what they name (tools/setup.sh), or list a hardware-dependent test in "
                           "tests/CMakeLists.txt (docs/testing.md)\n", skipped);
    return Outcome::failed;
  }
  return Outcome::skipped;
}

/// \brief The process's exit code for an outcome.
inline int exit_code(Outcome o) {
  switch (o) {
    case Outcome::passed: return 0;
    case Outcome::skipped: return 77;
    case Outcome::failed: return 1;
  }
  return 1;
}

}  // namespace tessera::test
