#pragma once
// tessera doctor RUN_DIR: reads the flight records the ranks of a run left in RUN_DIR/flight
// (comm/flight_record.hpp) after a hang or a crash and says, in a few lines, which rank stopped
// where: which operation each waiting rank was in, which ranks never entered it (and where they
// were instead), which left no record.
#include <string>
#include <vector>

#include "comm/flight_record.hpp"

namespace tessera::cli {

/// \brief Prints the diagnosis of RUN_DIR's flight records on rank 0; returns 0. Throws
/// InputError for a RUN_DIR without records, or a record that cannot be read.
int doctor(const std::string& run_dir);

/// \brief The diagnosis of a run's records (any order; records of an older run than the newest
/// are left out and counted): a header, a line per operation ranks wait in and per rank missing
/// from it, and a verdict.
std::vector<std::string> diagnose(const std::vector<comm::FlightRecord>& records);

}  // namespace tessera::cli
