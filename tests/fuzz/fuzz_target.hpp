#pragma once
// What the fuzz targets of tests/fuzz share (docs/robustness.md): starting MPI and Kokkos once,
// each input as a file of its own, and the verdict on what a call did with it.
//
// The promise under test (DESIGN.md): bad input ends in InputError (exit 2 in the program). Any
// other exception, a signal, a sanitizer report or a hang is a finding. A finding prints one line
// naming the target and the exception and aborts, so that libFuzzer saves the input and the replay
// test (replay_main.cpp) fails on it.
#include <cstddef>
#include <cstdint>
#include <exception>
#include <string>
#include <string_view>

#include "core/error.hpp"

namespace tessera::fuzz {

/// \brief Starts MPI (once; every target works on MPI_COMM_SELF) and, when `kokkos`, Kokkos, and
/// registers an exit handler that runs `on_exit` (may be null: the target's own clean-up of what
/// holds Kokkos memory), then finalizes Kokkos and MPI.
void start(int* argc, char*** argv, bool kokkos, void (*on_exit)() = nullptr);

/// \brief Prints "fuzz finding: <target>: <what>" to stderr and aborts; but where `what` contains
/// one of the '|'-separated texts of TESSERA_FUZZ_IGNORE (by hand: fuzzing past a known bug),
/// throws IgnoredFinding, which ends the input as an InputError would.
[[noreturn]] void finding(std::string_view target, const std::string& what);

/// Thrown by finding() for an ignored finding; no std::exception, so no target catches it.
struct IgnoredFinding {};

/// \brief One input written to a file of its own under /dev/shm (else $TMPDIR or /tmp), removed
/// again on destruction. Each input gets a new name: HDF5 recognises a file it holds open by its
/// inode, so a reused name could meet a stale handle of an earlier input.
class TempFile {
 public:
  TempFile(const std::uint8_t* data, std::size_t size, std::string_view suffix);
  ~TempFile();
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

/// \brief Writes text to a new temporary file (as TempFile) and returns its path; the caller
/// removes it.
std::string write_temp(std::string_view text, std::string_view suffix);

/// \brief True when TESSERA_FUZZ_VERBOSE is set: then every InputError is printed (to see how
/// far the seeds get).
bool verbose();
void report_input_error(std::string_view target, std::string_view step, const InputError& e);

/// \brief "std::runtime_error: <what>": the exception's type and message.
std::string describe(const std::exception& e);

/// \brief Runs body. Returns true when it returned, false when it threw InputError (the promised
/// outcome for bad input). Any other exception is a finding named after `target` and `step`.
template <class Body>
bool expect_input_errors_only(std::string_view target, std::string_view step, Body&& body) {
  std::string what;
  try {
    body();
    return true;
  } catch (const InputError& e) {
    if (verbose()) report_input_error(target, step, e);
    return false;
  } catch (const IgnoredFinding&) {
    return false;
  } catch (const std::exception& e) {
    what = std::string(step) + ": " + describe(e);
  } catch (...) {
    what = std::string(step) + ": an exception that is no std::exception";
  }
  try {
    finding(target, what);
  } catch (const IgnoredFinding&) {
  }
  return false;
}

}  // namespace tessera::fuzz
