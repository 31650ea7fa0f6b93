#pragma once
// The watchdog: a thread that ends a run whose rank has been blocked in one communication
// operation for longer than comm.timeout_s (a peer died or hangs), instead of letting it wait
// forever. It watches what the flight recorder (comm/flight_recorder.hpp) says the main thread
// is blocked in: a collective or transfer of the Communicator, agree(), or a collective file
// operation the trainer marks (dataset reads, checkpoint writes). On a timeout it writes this
// rank's flight record, prints one line naming the operation, its group, sequence number, bytes
// and what is known of the missing ranks, and ends the process with exit code 5 (_exit: no
// destructor, no MPI call, so mpirun and srun see the exit and end the other ranks).
//
// It never calls MPI and never touches the main thread's data: it observes, so results do not
// change. It also writes the flight record, without ending anything, when a stop signal
// (SIGTERM, SIGUSR1) arrives (mpirun and Slurm send SIGTERM before SIGKILL when they end a job),
// and when a wait has lasted half of comm.timeout_s (reason "waiting"; removed again when the wait
// ends): once one rank has timed out, mpirun kills the others within milliseconds.
#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

#include "comm/flight_record.hpp"

namespace tessera::comm {

struct WatchdogSetup {
  RecordIdentity who;  ///< who.run_dir and who.timeout_s drive the watchdog
  /// Polled: nonzero (the signal's number) once a stop signal has arrived; may be empty.
  std::function<int()> pending_signal;
};

class Watchdog {
 public:
  /// \brief Starts watching (a thread); who.timeout_s > 0.
  explicit Watchdog(WatchdogSetup setup);
  /// Stops the thread.
  ~Watchdog();
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  /// \brief Writes this rank's flight record now (reason "internal_error", "signal", ...).
  /// Any thread but a signal handler. Returns the path, or "" when it could not be written.
  std::string write_record(const std::string& reason, const std::string& message) const;

  /// \brief The line a timeout prints (without "tessera: error: "), from a snapshot whose
  /// `waiting` is set; exposed for tests.
  static std::string timeout_message(const RecordIdentity& who, const FlightSnapshot& s,
                                     const std::string& record);

  /// Seconds between two looks at the recorder for a timeout of `timeout_s`.
  static double poll_interval(double timeout_s);

 private:
  void run();
  void expire() const;  ///< on a timeout: record, line, _exit(5); returns if the wait ended meanwhile

  WatchdogSetup setup_;
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace tessera::comm
