#include "comm/watchdog.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <system_error>

#include "core/error.hpp"

namespace tessera::comm {

namespace {

std::string signal_name(int sig) {
  switch (sig) {
    case SIGTERM: return "SIGTERM";
    case SIGUSR1: return "SIGUSR1";
    case SIGINT: return "SIGINT";
    default: return fmt::format("signal {}", sig);
  }
}

const std::vector<int>* members_of(const FlightSnapshot& s, const char* group) {
  for (const auto& g : s.groups)
    if (std::string_view(g.name) == group) return &g.members;
  return nullptr;
}

}  // namespace

Watchdog::Watchdog(WatchdogSetup setup) : setup_(std::move(setup)) {
  thread_ = std::thread([this] { run(); });
}

Watchdog::~Watchdog() {
  {
    const std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

double Watchdog::poll_interval(double timeout_s) {
  // A timeout is noticed within 5% of it, and a stop signal within 0.1 s (mpirun sends SIGKILL
  // about two seconds after SIGTERM).
  return std::clamp(timeout_s / 20.0, 0.001, 0.1);
}

void Watchdog::run() {
  const double timeout = setup_.who.timeout_s;
  const std::chrono::duration<double> period(poll_interval(timeout));
  bool signal_recorded = false;
  std::uint64_t early = 0;  // the wait an early record on disk describes
  std::unique_lock lock(mutex_);
  while (!wake_.wait_for(lock, period, [this] { return stopping_; })) {
    if (!signal_recorded && setup_.pending_signal) {
      if (const int sig = setup_.pending_signal(); sig != 0) {
        signal_recorded = true;
        early = 0;  // this record stays
        write_record("signal", fmt::format("stopped by {}", signal_name(sig)));
      }
    }
    const auto waiting = flight_recorder().waiting();
    if (waiting && waiting->second > timeout) expire();
    // Half-way, the record is written already: when the first rank times out, mpirun kills the
    // others within milliseconds, before they time out themselves. It goes when the wait ends.
    const std::uint64_t id = waiting ? waiting->first.id : 0;
    if (early != 0 && early != id) {
      std::error_code ec;
      std::filesystem::remove(record_path(setup_.who.run_dir, setup_.who.rank), ec);
      early = 0;
    }
    if (id != 0 && early == 0 && !signal_recorded && waiting->second > timeout / 2) {
      early = id;
      write_record("waiting", fmt::format("blocked for {:.1f} s of comm.timeout_s = {:g} s", waiting->second, timeout));
    }
  }
}

void Watchdog::expire() const {
  const FlightSnapshot s = flight_recorder().snapshot();
  if (!s.waiting) return;  // it completed after all
  const std::string path = record_path(setup_.who.run_dir, setup_.who.rank);
  const std::string line = timeout_message(setup_.who, s, path);
  const bool written = comm::write_record(make_record(setup_.who, s, "timeout", line), path);
  std::fprintf(stderr, "tessera: error: %s%s\n", line.c_str(),
               written ? "" : " (the flight record could not be written)");
  std::fflush(stdout);
  std::fflush(stderr);
  _exit(static_cast<int>(ExitCode::timeout));
}

std::string Watchdog::write_record(const std::string& reason, const std::string& message) const {
  const std::string path = record_path(setup_.who.run_dir, setup_.who.rank);
  const FlightRecord r = make_record(setup_.who, flight_recorder().snapshot(), reason, message);
  return comm::write_record(r, path) ? path : std::string();
}

std::string Watchdog::timeout_message(const RecordIdentity& who, const FlightSnapshot& s,
                                      const std::string& record) {
  const FlightOp& op = *s.waiting;
  std::string what, missing;
  if (op.p2p) {
    const bool send = std::string_view(op.op) == "send";
    what = fmt::format("{} #{} {} rank {} in the {} group ({})", op.op, op.seq, send ? "to" : "from",
                       op.peer, op.group, format_bytes(op.bytes));
    missing = fmt::format("rank {} did not {} it", op.peer, send ? "receive" : "send");
  } else {
    const std::vector<int>* members = members_of(s, op.group);
    std::vector<int> others;
    if (members)
      std::copy_if(members->begin(), members->end(), std::back_inserter(others),
                   [&](int r) { return r != who.rank; });
    what = fmt::format("{} #{} of the {} group ({}{}{})", op.op, op.seq, op.group,
                       members ? fmt::format("ranks {}; ", rank_list(*members)) : std::string(),
                       op.peer >= 0 ? fmt::format("root rank {}; ", op.peer) : std::string(),
                       format_bytes(op.bytes));
    missing = others.empty() ? std::string("which rank did not arrive is unknown here")
                             : fmt::format("which of ranks {} did not arrive is unknown here", rank_list(others));
  }
  return fmt::format("rank {}: {} did not complete within comm.timeout_s = {:g} s (waiting since {}): "
                     "a peer died or hangs; {}; flight record {}, see `tessera doctor {}`",
                     who.rank, what, who.timeout_s, clock_time(s.waiting_since), missing, record,
                     who.run_dir);
}

}  // namespace tessera::comm
