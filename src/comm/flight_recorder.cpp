#include "comm/flight_recorder.hpp"

#include <algorithm>
#include <chrono>

namespace tessera::comm {

namespace {
constexpr const char* kUnnamed = "other";
}  // namespace

double unix_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

double steady_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

namespace {
// Operations are timed by the steady clock alone (one clock read each) and shown as Unix time
// through the offset between the two clocks, taken once.
double unix_offset() {
  static const double offset = unix_seconds() - steady_seconds();
  return offset;
}
}  // namespace

FlightRecorder& flight_recorder() {
  // Never destroyed: a Communicator that outlives static destruction (one held by an exit handler,
  // or destroyed while the process exits) still detaches from it.
  static FlightRecorder* const recorder = new FlightRecorder;
  return *recorder;
}

void FlightRecorder::attach(MPI_Comm c, const char* name, std::vector<int> members) {
  const std::lock_guard lock(mutex_);
  std::erase_if(comms_, [c](const Counters& k) { return k.group.comm == c; });
  Counters k;
  const std::size_t n = members.size();
  k.group = {c, name, std::move(members)};
  k.sends.assign(n, 0);
  k.recvs.assign(n, 0);
  comms_.push_back(std::move(k));
}

void FlightRecorder::detach(MPI_Comm c) {
  const std::lock_guard lock(mutex_);
  std::erase_if(comms_, [c](const Counters& k) { return k.group.comm == c; });
}

FlightRecorder::Counters* FlightRecorder::find(MPI_Comm c) {
  for (auto& k : comms_)
    if (k.group.comm == c) return &k;
  return nullptr;
}

const FlightRecorder::Counters* FlightRecorder::find(MPI_Comm c) const {
  for (const auto& k : comms_)
    if (k.group.comm == c) return &k;
  return nullptr;
}

std::uint64_t FlightRecorder::next_seq(MPI_Comm c) const {
  const std::lock_guard lock(mutex_);
  const Counters* k = find(c);
  return k ? k->collectives + 1 : 0;
}

void FlightRecorder::skip_seq(MPI_Comm c) {
  const std::lock_guard lock(mutex_);
  if (Counters* k = find(c)) ++k->collectives;
}

FlightOp* FlightRecorder::slot(std::uint64_t id) {
  FlightOp& s = ring_[(id - 1) % kCapacity];
  return s.id == id ? &s : nullptr;
}

// Under the lock: gives `op` the next id and a start time, stores it, and pushes the wait.
std::uint64_t FlightRecorder::record(FlightOp op, bool blocking) {
  const double now = steady_seconds();
  op.id = next_id_++;
  op.start = now + unix_offset();
  ring_[(op.id - 1) % kCapacity] = op;
  if (blocking) waits_.push_back({op, now});
  return op.id;
}

std::uint64_t FlightRecorder::begin_collective(const char* op, MPI_Comm c, std::uint64_t bytes,
                                               bool blocking, int root) {
  const std::lock_guard lock(mutex_);
  Counters* k = find(c);
  FlightOp f;
  f.op = op;
  f.group = k ? k->group.name : kUnnamed;
  f.peer = root;
  f.seq = k ? ++k->collectives : 0;
  f.bytes = bytes;
  return record(f, blocking);
}

std::uint64_t FlightRecorder::begin_p2p(const char* op, MPI_Comm c, int peer, int peer_in_comm,
                                        bool send, std::uint64_t bytes, bool blocking) {
  const std::lock_guard lock(mutex_);
  Counters* k = find(c);
  FlightOp f;
  f.op = op;
  f.group = k ? k->group.name : kUnnamed;
  f.p2p = true;
  f.peer = peer;
  if (k && peer_in_comm >= 0 && static_cast<std::size_t>(peer_in_comm) < k->sends.size())
    f.seq = ++(send ? k->sends : k->recvs)[static_cast<std::size_t>(peer_in_comm)];
  f.bytes = bytes;
  return record(f, blocking);
}

void FlightRecorder::begin_wait(std::uint64_t id) {
  if (id == 0) return;
  const std::lock_guard lock(mutex_);
  if (const FlightOp* s = slot(id)) waits_.push_back({*s, steady_seconds()});
}

void FlightRecorder::end(std::uint64_t id) {
  if (id == 0) return;
  const std::lock_guard lock(mutex_);
  if (FlightOp* s = slot(id); s && s->end < 0.0) s->end = steady_seconds() + unix_offset();
  // Waits nest (a collective inside a checkpoint write): the innermost ends first.
  const auto it = std::find_if(waits_.rbegin(), waits_.rend(), [id](const Wait& w) { return w.op.id == id; });
  if (it != waits_.rend()) waits_.erase(std::next(it).base());
}

FlightSnapshot FlightRecorder::snapshot() const {
  const std::lock_guard lock(mutex_);
  FlightSnapshot s;
  const std::uint64_t last = next_id_ - 1;
  const std::uint64_t first = last >= kCapacity ? last - kCapacity + 1 : 1;
  for (std::uint64_t id = first; id <= last; ++id) {
    const FlightOp& op = ring_[(id - 1) % kCapacity];
    if (op.id == id) s.ops.push_back(op);
  }
  for (const auto& k : comms_) s.groups.push_back(k.group);
  if (!waits_.empty()) {
    const Wait& w = waits_.back();
    s.waiting = w.op;
    s.waiting_seconds = steady_seconds() - w.since;
    s.waiting_since = w.since + unix_offset();
  }
  return s;
}

std::optional<std::pair<FlightOp, double>> FlightRecorder::waiting() const {
  const std::lock_guard lock(mutex_);
  if (waits_.empty()) return std::nullopt;
  const Wait& w = waits_.back();
  return std::make_pair(w.op, steady_seconds() - w.since);
}

void FlightRecorder::clear() {
  const std::lock_guard lock(mutex_);
  ring_ = {};
  next_id_ = 1;
  comms_.clear();
  waits_.clear();
}

}  // namespace tessera::comm
