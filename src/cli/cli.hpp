#pragma once
// The command line of DESIGN.md: train, check, eval, prepare, inspect, diff, bench.
namespace tessera::cli {

/// \brief Parses the command line and runs the subcommand on every rank; returns the exit code.
/// Errors every rank reaches print one "tessera: error: ..." line on rank 0 (exit 2 or 3);
/// anything else prints the rank and aborts the whole job.
int run(int argc, char** argv);

}  // namespace tessera::cli
