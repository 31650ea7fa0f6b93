#pragma once
// A flight record: one rank's recent communication on disk, RUN_DIR/flight/rank_<N>.json, written
// when the rank times out in an operation (exit code 5), fails with an internal error, or receives
// a stop signal (comm/watchdog.hpp). `tessera doctor RUN_DIR` reads the records of all ranks.
// The format is in docs/design.md ("Flight records").
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "comm/flight_recorder.hpp"

namespace tessera::comm {

inline constexpr const char* kFlightRecordFormat = "tessera-flight-record";
inline constexpr int kFlightRecordVersion = 1;

/// One operation of a record (FlightOp with owned strings).
struct RecordedOp {
  std::uint64_t id = 0;
  std::string op, group;
  bool p2p = false;
  int peer = -1;         ///< world rank; -1: none
  std::uint64_t seq = 0;
  std::uint64_t bytes = 0;
  double start = 0.0;    ///< Unix time, seconds
  double end = -1.0;     ///< negative: still in flight when the record was written
  bool in_flight() const { return end < 0.0; }
};

/// Who wrote a record: the same for every record of a run but rank, host, pid and coordinates.
struct RecordIdentity {
  std::string run;        ///< the run's start on rank 0 (ISO 8601), the same on every rank
  std::string run_dir;
  int rank = 0, ranks = 1;
  std::string host;
  long pid = 0;
  int data = 0, tensor = 0, pipeline = 0, spatial = 0;  ///< this rank's coordinates
  int dp = 1, tp = 1, pp = 1, sp = 1;                   ///< the grid
  double timeout_s = 0.0;                  ///< comm.timeout_s
};

struct FlightRecord {
  RecordIdentity who;
  std::string reason;   ///< "timeout", "waiting" (half-way to it), "internal_error" or "signal"
  std::string message;  ///< the line printed, or the error or signal
  double written = 0.0;  ///< Unix time
  std::map<std::string, std::vector<int>> groups;  ///< name -> world ranks, in group-rank order
  std::uint64_t waiting_on = 0;  ///< id of the operation the rank was blocked in; 0: none
  double waiting_since = 0.0;    ///< Unix time
  std::vector<RecordedOp> ops;   ///< oldest first

  /// The operation with this id, or nullptr.
  const RecordedOp* find(std::uint64_t id) const;
};

/// \brief A record of `who` from the recorder's snapshot.
FlightRecord make_record(const RecordIdentity& who, const FlightSnapshot& snapshot,
                         const std::string& reason, const std::string& message);

/// \brief RUN_DIR/flight/rank_<N>.json
std::string record_path(const std::string& run_dir, int rank);

/// \brief Writes the record as JSON to `path` (a temporary file, then renamed, so a reader never
/// sees half a record); creates the folder. Never calls MPI. Returns false when it could not.
bool write_record(const FlightRecord& record, const std::string& path);

/// \brief Reads a record; throws InputError naming the file and what is wrong.
FlightRecord read_record(const std::string& path);

/// \brief Unix time as local "12:03:05.123".
std::string clock_time(double unix_s);
/// \brief Unix time as ISO 8601 UTC with microseconds, "2026-11-25T12:03:05.123456Z".
std::string iso_time(double unix_s);
/// \brief "4096 bytes", "1.5 KiB", "12.0 MiB".
std::string format_bytes(std::uint64_t bytes);
/// \brief Ranks in order as "0,2,5-9" (runs of three or more as a range).
std::string rank_list(std::vector<int> ranks);

}  // namespace tessera::comm
