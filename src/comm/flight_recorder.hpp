#pragma once
// The flight recorder: each process keeps its last kCapacity communication operations in memory
// (what, which group, the peer or root, bytes, the sequence number, start and end time), and the
// stack of operations the calling thread is blocked in. The watchdog (comm/watchdog.hpp) reads
// both from its own thread; a flight record (comm/flight_record.hpp) is a copy of them on disk.
//
// Sequence numbers are what make records of different ranks comparable (`tessera doctor`):
// collectives are numbered 1, 2, ... per communicator, in the order every rank of it calls them;
// a send or receive 1, 2, ... per (communicator, peer, direction), in the order MPI matches them.
// Communicators are known by their handle: the Communicator names its four (world, data, tensor,
// pipeline) and their world ranks with attach() and forgets them with detach().
//
// One process-wide instance (flight_recorder()), guarded by a mutex: an operation costs two
// uncontended lock/unlock pairs and two clock reads (docs/design.md, "Watchdog").
#include <mpi.h>

#include <array>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace tessera::comm {

/// One operation as the recorder holds it. `op` and `group` point to string literals.
struct FlightOp {
  std::uint64_t id = 0;    ///< 1, 2, ... in the order operations started in this process; 0: empty
  const char* op = "";     ///< "allreduce", "recv", "agree", "checkpoint write", ...
  const char* group = "";  ///< the communicator's name: "world", "data", "tensor", "pipeline"
  bool p2p = false;        ///< a send or receive (seq counts per peer and direction)
  int peer = -1;           ///< world rank of the other side (send, recv) or the root (broadcast)
  std::uint64_t seq = 0;
  std::uint64_t bytes = 0;
  double start = 0.0;      ///< Unix time, seconds
  double end = -1.0;       ///< Unix time; negative while in flight
};

/// A named communicator: its name and the world ranks of its members, in group-rank order.
struct FlightGroup {
  MPI_Comm comm = MPI_COMM_NULL;
  const char* name = "";
  std::vector<int> members;
};

/// What the recorder holds at one moment, oldest operation first.
struct FlightSnapshot {
  std::vector<FlightOp> ops;
  std::vector<FlightGroup> groups;
  /// The operation the calling thread is blocked in (the innermost), with when it began to wait.
  std::optional<FlightOp> waiting;
  double waiting_since = 0.0;     ///< Unix time
  double waiting_seconds = 0.0;   ///< how long it has waited so far
};

class FlightRecorder {
 public:
  static constexpr std::size_t kCapacity = 256;

  /// \brief Names communicator `c` ("data") and its members' world ranks, for records and
  /// messages; its operations are numbered from 1. `name` must be a string literal.
  void attach(MPI_Comm c, const char* name, std::vector<int> members);
  /// Forgets `c` (before it is freed: MPI may reuse the handle).
  void detach(MPI_Comm c);

  /// \brief The sequence number the next collective on `c` will get.
  std::uint64_t next_seq(MPI_Comm c) const;
  /// \brief Counts a collective on `c` that is not recorded (a test hook skipped it).
  void skip_seq(MPI_Comm c);

  /// \brief Records the start of a collective on `c` (`root`: world rank of a broadcast's root, or
  /// -1). `blocking`: the calling thread waits in it from now until end(). Returns its id.
  std::uint64_t begin_collective(const char* op, MPI_Comm c, std::uint64_t bytes, bool blocking,
                                 int root = -1);
  /// \brief Records the start of a send or receive with world rank `peer`, whose rank in `c` is
  /// `peer_in_comm`. Returns its id.
  std::uint64_t begin_p2p(const char* op, MPI_Comm c, int peer, int peer_in_comm, bool send,
                          std::uint64_t bytes, bool blocking);
  /// \brief The calling thread waits on operation `id` (started nonblocking) from now until end().
  void begin_wait(std::uint64_t id);
  /// \brief Records the end of operation `id` (and of the wait on it). Harmless for id 0.
  void end(std::uint64_t id);

  /// \brief A copy of everything, for a flight record or a message.
  FlightSnapshot snapshot() const;
  /// \brief Only the innermost wait, or nothing; cheap enough to call every few milliseconds.
  std::optional<std::pair<FlightOp, double>> waiting() const;  ///< the op and seconds waited

  /// Forgets every operation and communicator (tests).
  void clear();

 private:
  struct Counters {
    FlightGroup group;
    std::uint64_t collectives = 0;
    std::vector<std::uint64_t> sends, recvs;  ///< by peer's rank in the communicator
  };
  struct Wait {
    FlightOp op;   ///< a copy: an outer wait outlives its slot in the ring
    double since;  ///< steady clock, seconds
  };
  Counters* find(MPI_Comm c);
  const Counters* find(MPI_Comm c) const;
  FlightOp* slot(std::uint64_t id);
  std::uint64_t record(FlightOp op, bool blocking);

  mutable std::mutex mutex_;
  std::array<FlightOp, kCapacity> ring_{};
  std::uint64_t next_id_ = 1;
  std::vector<Counters> comms_;
  std::vector<Wait> waits_;
};

/// The process's recorder.
FlightRecorder& flight_recorder();

/// Seconds since the Unix epoch, and of the steady clock.
double unix_seconds();
double steady_seconds();

/// \brief RAII: an operation recorded from construction to destruction (a blocking collective,
/// a collective file operation, agree()). Move-only.
class WatchedOp {
 public:
  WatchedOp() = default;
  explicit WatchedOp(std::uint64_t id) : id_(id) {}
  WatchedOp(WatchedOp&& o) noexcept : id_(o.id_) { o.id_ = 0; }
  WatchedOp& operator=(WatchedOp&&) = delete;
  WatchedOp(const WatchedOp&) = delete;
  WatchedOp& operator=(const WatchedOp&) = delete;
  ~WatchedOp() { flight_recorder().end(id_); }

 private:
  std::uint64_t id_ = 0;
};

/// \brief Records a blocking collective section `op` (a string literal) over communicator `c`:
/// every rank of `c` must run it, in the same order as its other collectives.
inline WatchedOp watch(const char* op, MPI_Comm c, std::uint64_t bytes = 0) {
  return WatchedOp(flight_recorder().begin_collective(op, c, bytes, true));
}

}  // namespace tessera::comm
