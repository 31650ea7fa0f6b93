#pragma once
// Errors and the exit codes of DESIGN.md.
//
// Two kinds of failure in a parallel program:
//  - an error every rank reaches in the same place (bad deck, bad dataset, checkpoint that does
//    not fit): throw InputError or NumericError on every rank; main() prints it once on rank 0 and
//    exits with the code below;
//  - a local error (one rank's I/O broke, a bug): throw anything else; main() prints the rank and
//    calls MPI_Abort so no rank is left hanging in a collective.
// A rank blocked in a collective or transfer longer than comm.timeout_s (a peer died or hangs)
// cannot throw: the watchdog thread (comm/watchdog.hpp) ends it with exit code 5.
// Where only some ranks may see a problem (one rank fails to open a file), use
// tessera::agree() from comm/agree.hpp to turn it into an error every rank throws.
#include <stdexcept>
#include <string>

namespace tessera {

/// Exit codes (DESIGN.md).
enum class ExitCode : int { ok = 0, failure = 1, bad_input = 2, numerical = 3, signalled = 4, timeout = 5 };

/// Bad input: deck, data, checkpoint that does not fit. Exit code 2. The message is the whole
/// line after "tessera: error: " and names the file, key or dataset and what was expected.
class InputError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Non-finite loss or gradients. Exit code 3.
class NumericError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace tessera
